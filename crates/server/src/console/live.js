// Follows a run page's timeline as server-sent events from /events, so the page changes
// without a reload. Without JavaScript the page is complete as served; this only adds rows.
(function () {
  "use strict";
  var table = document.getElementById("timeline");
  if (!table || !window.EventSource) return;
  var body = table.tBodies[0];
  var state = document.getElementById("state");
  var run = table.getAttribute("data-run");
  var after = table.getAttribute("data-after") || "0";
  var states = ["accepted", "running", "waiting_approval", "waiting_alarm", "waiting_event",
                "completed", "failed", "cancelled", "escalated"];
  var url = "/events?run_id=" + encodeURIComponent(run) + "&after=" + encodeURIComponent(after);
  var source = new EventSource(url);
  source.addEventListener("run", function (message) {
    var e;
    try { e = JSON.parse(message.data); } catch (_) { return; }
    var row = body.insertRow(-1);
    row.className = "live";
    [new Date(e.at_ms).toISOString().replace(/\.\d+Z$/, "Z"), e.kind, e.detail].forEach(function (text) {
      row.insertCell(-1).textContent = text;
    });
    if (state && states.indexOf(e.kind) >= 0) state.textContent = e.kind;
    if (state && e.kind === "approval_decided") state.textContent = "running";
  });
  document.getElementById("live-note").textContent = "Live: new events appear as they happen.";
})();
