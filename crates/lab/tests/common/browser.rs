//! A real browser for the console's tests: Debian's `chromium`, headless, driven through
//! `chromedriver` over WebDriver. Both must be installed (`scripts/test.sh` installs them);
//! a missing one fails the test, it never skips it.

use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fantoccini::{Client, ClientBuilder, Locator};

use super::Served;

/// `chromedriver` on a free loopback port, stopped when dropped.
pub struct Driver {
    child: Child,
    port: u16,
    /// One fresh profile per browser, removed with the driver.
    profiles: Vec<tempfile::TempDir>,
}

impl Driver {
    pub fn start() -> Driver {
        // Two TLS back ends are linked in (the server's ring, the WebDriver client's
        // aws-lc): name one. Nothing here speaks TLS to chromedriver anyway.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver is not installed: run scripts/test.sh, which installs chromium and chromium-driver");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen on {port} within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Driver { child, port, profiles: Vec::new() }
    }

    /// A new headless browser with an empty profile.
    pub async fn browser(&mut self) -> Client {
        let profile = tempfile::tempdir().expect("profile dir");
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--window-size=1280,1000".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        self.profiles.push(profile);
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({"binary": "/usr/bin/chromium", "args": args}),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a chromium session through chromedriver")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A test that failed before closing its browser leaves chromium running without its
        // driver: end every process started with one of our profiles.
        for profile in &self.profiles {
            let _ = Command::new("pkill").arg("-KILL").arg("-f").arg(profile.path()).status();
        }
    }
}

/// The text of the element `css`, once there is one (within 30 s).
pub async fn text_of(browser: &Client, css: &str) -> String {
    match browser.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css(css)).await {
        Ok(element) => element.text().await.expect("element text"),
        Err(e) => panic!("no {css} on the page ({e}); the page is:\n{}", page(browser).await),
    }
}

/// The page's address and source, for a failure's message.
pub async fn page(browser: &Client) -> String {
    let url = browser.current_url().await.map(|u| u.to_string()).unwrap_or_default();
    format!("{url}\n{}", browser.source().await.unwrap_or_default())
}

/// Whether an element `css` is on the page now.
pub async fn has(browser: &Client, css: &str) -> bool {
    browser.find(Locator::Css(css)).await.is_ok()
}

/// Waits until `css`'s text satisfies `ok`, polling (within 30 s); returns it.
pub async fn wait_for_text(browser: &Client, css: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = match browser.find(Locator::Css(css)).await {
            Ok(element) => element.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if ok(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{css} still reads {text:?} after 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Saves a screenshot of the page as `target/ui-screenshots/NAME.png`.
pub async fn screenshot(browser: &Client, name: &str) {
    let png = browser.screenshot().await.expect("screenshot");
    // The test binary is target/<profile>/deps/<name>: the target directory is three up.
    let exe = std::env::current_exe().expect("test binary path");
    let target = exe.ancestors().nth(3).expect("target directory");
    let dir = target.join("ui-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    std::fs::write(dir.join(format!("{name}.png")), png).expect("write screenshot");
}

/// Signs `browser` in to `server`'s console with `token`; returns once the answer loaded.
pub async fn sign_in(browser: &Client, server: &Served, token: &str) {
    browser.goto(&server.url("/ui/sign-in")).await.expect("sign-in page");
    let field = browser.wait().for_element(Locator::Css("#token")).await.expect("token field");
    field.send_keys(token).await.expect("type the token");
    click(browser, "#sign-in").await;
    // Signed in, or refused: either way the answer to the form has loaded.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !has(browser, "#signed-in-as").await && !has(browser, "#refused").await {
        assert!(Instant::now() < deadline, "no answer to the sign-in form after 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks the element `css`, once there is one (within 30 s).
pub async fn click(browser: &Client, css: &str) {
    let element = browser
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} to click: {e}"));
    element.click().await.unwrap_or_else(|e| panic!("clicking {css}: {e}"));
}

/// Waits until the browser is at `path` (a click's navigation may still be under way).
pub async fn wait_for_path(browser: &Client, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = browser.current_url().await.expect("url").path().to_string();
        if now == path {
            return;
        }
        assert!(Instant::now() < deadline, "at {now}, not {path}, after 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
