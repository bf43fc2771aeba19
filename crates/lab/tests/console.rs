//! The reviewer console in a real browser (headless Debian chromium through chromedriver)
//! against a real `durafiber serve`: a reviewer signs in, sees what the agent saw, approves,
//! and watches the run finish; a stale page, a second reviewer and a reader decide nothing;
//! signing out ends the session. Screenshots of each page go to `target/ui-screenshots/`.
//!
//! The forms' protections are also checked without a browser, where a browser would not
//! let a test break them: a POST without the CSRF token, the cookie's flags.

use std::time::{Duration, Instant};

use durafiber_testkit::upstream::Upstream;
use fantoccini::Locator;
use reqwest::StatusCode;
use serde_json::{Value, json};

mod common;
use common::{
    Served,
    browser::{Driver, click, has, screenshot, sign_in, text_of, wait_for_path, wait_for_text},
};

/// Starts a refund of `cents` for `order` and waits until it asks for approval; returns the
/// run id and the payload hash it shows.
async fn refund_waiting(server: &Served, order: &str, cents: u64, upstream: &str) -> (String, String) {
    refund_waiting_for(server, order, cents, upstream, None).await
}

/// `refund_waiting`, with an approval rule when one person is not enough.
async fn refund_waiting_for(
    server: &Served,
    order: &str,
    cents: u64,
    upstream: &str,
    rule: Option<Value>,
) -> (String, String) {
    let mut input = json!({"order_id": order, "amount_cents": cents, "customer_email": "c@example.com", "upstream": upstream});
    if let Some(rule) = rule {
        input["approval_rule"] = rule;
    }
    let r = server
        .client()
        .post(server.url("/runs"))
        .header("Idempotency-Key", order)
        .body(json!({"kind": "refund", "input": input}).to_string())
        .send()
        .await
        .expect("start");
    assert!(r.status().is_success());
    let run_id = r.json::<Value>().await.expect("json")["run_id"].as_str().expect("run_id").to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pending: Value = server
            .client()
            .get(server.url("/approvals"))
            .send()
            .await
            .expect("approvals")
            .json()
            .await
            .expect("json");
        if let Some(p) = pending.as_array().into_iter().flatten().find(|p| p["run_id"] == json!(run_id)) {
            return (run_id, p["payload_hash"].as_str().expect("hash").to_string());
        }
        assert!(Instant::now() < deadline, "run {run_id} never asked for approval");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_sees_what_the_agent_saw_approves_and_the_run_completes_in_a_real_browser() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let alice = server.create_token("alice", "reviewer").await;
    let bob = server.create_token("bob", "reviewer").await;
    let rita = server.create_token("rita", "reader").await;
    let (run_id, hash) = refund_waiting(&server, "order-7", 1250, &upstream.url()).await;
    let decision_path = format!("/ui/runs/{run_id}/approvals/refund");

    let mut driver = Driver::start();
    let a = driver.browser().await;
    let b = driver.browser().await;

    // Not signed in: every page sends the browser to sign in; a wrong token is refused.
    a.goto(&server.url("/ui/approvals")).await.expect("inbox");
    wait_for_path(&a, "/ui/sign-in").await;
    screenshot(&a, "sign-in").await;
    sign_in(&a, &server, "dft_0000").await;
    assert!(text_of(&a, "#refused").await.contains("not valid"));
    sign_in(&a, &server, &alice).await;
    assert!(text_of(&a, "#signed-in-as").await.contains("alice (reviewer)"));

    // The inbox lists the pending approval with its kind and run key.
    wait_for_path(&a, "/ui/approvals").await;
    let inbox = text_of(&a, "#inbox").await;
    assert!(inbox.contains("refund") && inbox.contains("order-7"), "{inbox}");
    screenshot(&a, "approvals").await;

    // The decision page shows the payload readably and exactly, its hash, and the context.
    click(&a, "#inbox a.review").await;
    wait_for_path(&a, &decision_path).await;
    let payload = text_of(&a, "#payload").await;
    assert!(payload.contains("Amount cents") && payload.contains("1250"), "{payload}");
    assert!(text_of(&a, "#payload-json").await.contains("\"amount_cents\": 1250"));
    assert_eq!(text_of(&a, "#payload-hash").await, hash);
    assert!(text_of(&a, "#stash").await.contains("drafted"));
    assert!(text_of(&a, "#recent-events").await.contains("approval_requested"));
    screenshot(&a, "decision").await;

    // A second reviewer opens the same page before anyone decides.
    sign_in(&b, &server, &bob).await;
    b.goto(&server.url(&decision_path)).await.expect("decision page");
    assert!(has(&b, "#approve").await);

    // A stale page: the hash it posts is not the payload's any more. Nothing is decided.
    let stale = format!("jcs-sha256:{}", "0".repeat(64));
    a.execute("document.querySelector('input[name=payload_hash]').value = arguments[0];", vec![json!(stale)])
        .await
        .expect("age the page");
    click(&a, "#approve").await;
    assert!(text_of(&a, "#notice").await.contains("payload changed"));
    assert!(server.run_view(&run_id).await["approvals"][0]["decision"].is_null(), "a stale page decided");
    screenshot(&a, "stale").await;

    // The page shown again carries the current hash: approve, with a comment.
    let comment = a.find(Locator::Css("#comment")).await.expect("comment");
    comment.send_keys("regular customer; refund ok").await.expect("type");
    click(&a, "#approve").await;
    wait_for_path(&a, &format!("/ui/runs/{run_id}")).await;
    wait_for_text(&a, "#state", |s| s == "completed").await;
    screenshot(&a, "run").await;
    let view = server.run_view(&run_id).await;
    assert_eq!(view["run"]["status"]["completed"]["output"]["approved"], json!(true), "{view}");
    assert_eq!(view["approvals"][0]["decided_by"], json!("alice"));
    assert_eq!(view["approvals"][0]["decision"]["comment"], json!("regular customer; refund ok"));
    assert_eq!(upstream.objects("refunds").len(), 1, "one refund, exactly");
    let timeline = text_of(&a, "#timeline").await;
    assert!(timeline.contains("effect_committed") && timeline.contains("approve"), "{timeline}");

    // The second reviewer's page is now stale too: "already decided by alice", unchanged.
    click(&b, "#decline").await;
    assert!(text_of(&b, "#notice").await.contains("Already decided by alice"));
    assert_eq!(server.run_view(&run_id).await["approvals"][0]["decision"]["approved"], json!(true));

    // Signing out ends the session on the server: its cookie opens nothing afterwards.
    let cookie = b.get_named_cookie("durafiber_session").await.expect("session cookie");
    assert!(cookie.http_only() == Some(true), "the session cookie is HttpOnly");
    let old_cookie = format!("durafiber_session={}", cookie.value());
    click(&b, "#sign-out").await;
    wait_for_path(&b, "/ui/sign-in").await;
    let plain =
        reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let r = plain.get(server.url("/ui/approvals")).header("cookie", &old_cookie).send().await.expect("get");
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "a signed-out session still opens pages");
    b.goto(&server.url("/ui/approvals")).await.expect("inbox");
    wait_for_path(&b, "/ui/sign-in").await;

    // A reader sees the approval but no decide buttons, and a forged form is refused.
    let (second, _) = refund_waiting(&server, "order-8", 400, &upstream.url()).await;
    sign_in(&b, &server, &rita).await;
    b.goto(&server.url(&format!("/ui/runs/{second}/approvals/refund"))).await.expect("decision page");
    assert!(text_of(&b, "#read-only").await.contains("reader"));
    assert!(!has(&b, "#approve").await && !has(&b, "#decline").await);
    screenshot(&b, "reader").await;
    let forge = "var f = document.createElement('form'); f.method = 'post'; f.action = location.pathname;
        var add = function (n, v) { var i = document.createElement('input'); i.type = 'hidden'; i.name = n; i.value = v; f.appendChild(i); };
        add('csrf', document.querySelector('input[name=csrf]').value);
        add('payload_hash', document.getElementById('payload-hash').textContent);
        add('decision', 'approve'); document.body.appendChild(f); f.submit();";
    b.execute(forge, vec![]).await.expect("forge a decision");
    assert!(text_of(&b, "#message").await.contains("is a reader"));
    assert!(server.run_view(&second).await["approvals"][0]["decision"].is_null(), "a reader decided");

    // The run page follows the run live: a decision made elsewhere shows without a reload.
    a.goto(&server.url(&format!("/ui/runs/{second}"))).await.expect("run page");
    assert_eq!(text_of(&a, "#state").await, "waiting_approval");
    assert_eq!(text_of(&a, "#trace").await, durafiber_runtime::trace::trace_id_of(&second.as_str().into()));
    let second_hash = server.run_view(&second).await["approvals"][0]["payload_hash"].clone();
    let r = server
        .client_with(&alice)
        .post(server.url(&format!("/runs/{second}/approvals/refund")))
        .body(
            json!({"payload_hash": second_hash, "approved": false, "comment": "too small to matter"})
                .to_string(),
        )
        .send()
        .await
        .expect("approve");
    assert!(r.status().is_success());
    wait_for_text(&a, "#state", |s| s == "completed").await;
    assert!(
        has(&a, "#timeline tr.live").await,
        "the state changed without live rows: was the page reloaded?"
    );

    // The runs list filters by state; the attention page lists what needs a human.
    a.goto(&server.url("/ui/runs")).await.expect("runs");
    let runs = text_of(&a, "#runs").await;
    assert!(runs.contains(&run_id) && runs.contains(&second));
    let store = text_of(&a, "#store").await;
    assert!(store.contains("MiB on disk") && store.contains("0 runs deleted by retention"), "{store}");
    screenshot(&a, "runs").await;
    a.goto(&server.url("/ui/attention")).await.expect("attention");
    assert!(text_of(&a, "#no-escalated").await.contains("None"));
    screenshot(&a, "attention").await;

    // Signing out: the next page asks to sign in again.
    click(&a, "#sign-out").await;
    a.goto(&server.url("/ui/approvals")).await.expect("inbox");
    wait_for_path(&a, "/ui/sign-in").await;
    let _ = a.close().await;
    let _ = b.close().await;
}

/// A refund that takes two people: alice approves in her browser and sees "1 of 2 —
/// approved by alice" and no second form; bob approves in his, and the run completes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reviewers_approve_a_refund_that_takes_both_in_a_real_browser() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let alice = server.create_token("alice", "reviewer").await;
    let bob = server.create_token("bob", "reviewer").await;
    let rule = json!({"required": 2, "from": {"named": ["alice", "bob"]}});
    let (run_id, _) = refund_waiting_for(&server, "order-22", 90_000, &upstream.url(), Some(rule)).await;
    let decision_path = format!("/ui/runs/{run_id}/approvals/refund");
    let mut driver = Driver::start();
    let a = driver.browser().await;
    let b = driver.browser().await;

    sign_in(&a, &server, &alice).await;
    a.goto(&server.url(&decision_path)).await.expect("decision page");
    assert!(text_of(&a, "#quorum").await.starts_with("0 of 2"));
    click(&a, "#approve").await;
    // The answer is the same page, shown again: wait for what only the new one says.
    wait_for_text(&a, "#voted", |t| t.contains("You have approved this")).await;
    assert!(text_of(&a, "#quorum").await.contains("1 of 2 — approved by alice"));
    assert!(!has(&a, "#approve").await, "alice is offered a second decision");
    screenshot(&a, "quorum-one-of-two").await;
    assert!(upstream.objects("refunds").is_empty(), "refunded on one approval");

    sign_in(&b, &server, &bob).await;
    b.goto(&server.url(&decision_path)).await.expect("decision page");
    assert!(text_of(&b, "#quorum").await.contains("1 of 2 — approved by alice"));
    click(&b, "#approve").await;
    wait_for_path(&b, &format!("/ui/runs/{run_id}")).await;
    wait_for_text(&b, "#state", |s| s == "completed").await;
    let view = server.run_view(&run_id).await;
    assert_eq!(view["approvals"][0]["decision"]["comment"], json!("approved by alice, bob"));
    assert_eq!(upstream.objects("refunds").len(), 1, "one refund, exactly");
    let _ = a.close().await;
    let _ = b.close().await;
}

/// An operator cancels a run from its page; a reviewer gets no cancel form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_cancels_a_run_from_its_page_in_a_real_browser() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let olga = server.create_token("olga", "operator").await;
    let (run_id, _) = refund_waiting(&server, "order-9", 900, &upstream.url()).await;
    let mut driver = Driver::start();
    let a = driver.browser().await;
    sign_in(&a, &server, &olga).await;
    a.goto(&server.url(&format!("/ui/runs/{run_id}"))).await.expect("run page");
    let reason = a.wait().for_element(Locator::Css("#reason")).await.expect("cancel form");
    reason.send_keys("customer withdrew").await.expect("type");
    click(&a, "#cancel button").await;
    wait_for_text(&a, "#state", |s| s == "cancelled").await;
    assert!(text_of(&a, "#why").await.contains("customer withdrew"));
    let view = server.run_view(&run_id).await;
    assert_eq!(view["run"]["status"]["cancelled"]["reason"], json!("customer withdrew"));
    assert!(
        view["audit"]
            .as_array()
            .expect("audit")
            .iter()
            .any(|e| e["actor"] == "olga" && e["action"] == "cancel")
    );
    let _ = a.close().await;
}

/// An approval nobody answers escalates; the attention page lists the run with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escalated_run_shows_on_the_attention_page_with_its_reason() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.json");
    std::fs::write(&config, r#"{"escalate_after": "300ms"}"#).expect("config");
    let server = Served::start_with(&dir.path().join("data"), &["--config".as_ref(), config.as_os_str()]);
    let (run_id, _) = refund_waiting(&server, "order-11", 100, &upstream.url()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.run_view(&run_id).await["run"]["status"]["escalated"].is_object() {
        assert!(Instant::now() < deadline, "the unanswered approval never escalated");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut driver = Driver::start();
    let a = driver.browser().await;
    sign_in(&a, &server, &server.token).await;
    a.goto(&server.url("/ui/attention")).await.expect("attention");
    let escalated = text_of(&a, "#escalated").await;
    assert!(escalated.contains(&run_id) && escalated.contains("approval_timeout"), "{escalated}");
    screenshot(&a, "attention-escalated").await;
    // Its decision page says it can no longer be decided.
    a.goto(&server.url(&format!("/ui/runs/{run_id}/approvals/refund"))).await.expect("decision page");
    assert!(!has(&a, "#approve").await);
    let _ = a.close().await;
}

/// Without a browser: a form without the session's CSRF token changes nothing, and the
/// cookie is HttpOnly and SameSite=Strict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_forms_need_the_csrf_token_and_the_cookie_is_strict() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let (run_id, hash) = refund_waiting(&server, "order-10", 100, &upstream.url()).await;
    let http =
        reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");

    // Sign in without the sign-in form's own CSRF cookie: refused.
    let r = http
        .post(server.url("/ui/sign-in"))
        .form(&[("token", server.token.as_str()), ("csrf", "x")])
        .send()
        .await
        .expect("sign in");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // The real sign-in: the form's cookie and field match.
    let form = http.get(server.url("/ui/sign-in")).send().await.expect("form");
    let sign_in_cookie =
        form.headers()["set-cookie"].to_str().expect("cookie").split(';').next().expect("pair").to_string();
    let csrf = sign_in_cookie.split_once('=').expect("value").1.to_string();
    let r = http
        .post(server.url("/ui/sign-in"))
        .header("cookie", &sign_in_cookie)
        .form(&[("token", server.token.as_str()), ("csrf", csrf.as_str())])
        .send()
        .await
        .expect("sign in");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap_or("").to_string())
        .collect::<Vec<_>>();
    let session = set.iter().find(|c| c.starts_with("durafiber_session=")).expect("session cookie");
    assert!(
        session.contains("HttpOnly") && session.contains("SameSite=Strict") && session.contains("Path=/")
    );
    let cookie = session.split(';').next().expect("pair").to_string();

    // A decision without the CSRF token, or with another one: refused, nothing decided.
    for csrf in ["", "0000"] {
        let r = http
            .post(server.url(&format!("/ui/runs/{run_id}/approvals/refund")))
            .header("cookie", &cookie)
            .form(&[("csrf", csrf), ("payload_hash", hash.as_str()), ("decision", "approve")])
            .send()
            .await
            .expect("decide");
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    }
    // A cross-site form post is refused before any handler, whatever it carries.
    let r = http
        .post(server.url(&format!("/ui/runs/{run_id}/approvals/refund")))
        .header("cookie", &cookie)
        .header("origin", "http://evil.example")
        .form(&[("payload_hash", hash.as_str()), ("decision", "approve")])
        .send()
        .await
        .expect("decide");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(server.run_view(&run_id).await["approvals"][0]["decision"].is_null());

    // The session cookie reads the API (the live view's /events) but changes nothing there.
    let r =
        http.get(server.url(&format!("/runs/{run_id}"))).header("cookie", &cookie).send().await.expect("get");
    assert_eq!(r.status(), StatusCode::OK);
    let r = http
        .post(server.url(&format!("/runs/{run_id}/approvals/refund")))
        .header("cookie", &cookie)
        .header("content-type", "application/json")
        .body(json!({"payload_hash": hash, "approved": true}).to_string())
        .send()
        .await
        .expect("approve");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(server.run_view(&run_id).await["approvals"][0]["decision"].is_null());

    // Pages are not to be framed, cached or scripted from elsewhere.
    let r = http.get(server.url("/ui/approvals")).header("cookie", &cookie).send().await.expect("inbox");
    assert_eq!(r.status(), StatusCode::OK);
    let csp = r.headers()["content-security-policy"].to_str().expect("csp");
    assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"));
    assert_eq!(r.headers()["cache-control"], "no-store");
}
