// hamid /ui: reload the page when its figures change, without hammering the scheduler.
// The page names its stamp URL (data-stamp-url) and current stamp (data-stamp); this script asks
// every data-refresh-ms milliseconds with If-None-Match (a 304 costs the scheduler one small
// computation), waits a minute while the tab is hidden, and backs off to a minute on errors.
(function () {
  "use strict";
  var body = document.body;
  var url = body.getAttribute("data-stamp-url");
  var stamp = body.getAttribute("data-stamp");
  var base = parseInt(body.getAttribute("data-refresh-ms") || "5000", 10);
  var slowest = 60000;
  var delay = base;
  var status = document.getElementById("refresh-status");

  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }

  function schedule() {
    window.setTimeout(poll, document.hidden ? slowest : delay);
  }

  function failed(why) {
    delay = Math.min(delay * 2, slowest);
    say("auto-refresh paused (" + why + "); retrying in " + Math.round(delay / 1000) + " s");
    schedule();
  }

  function poll() {
    var headers = { "If-None-Match": '"' + stamp + '"' };
    window
      .fetch(url, { headers: headers, cache: "no-cache", credentials: "same-origin" })
      .then(function (response) {
        if (response.status === 304) {
          delay = base;
          say("auto-refresh on");
          schedule();
          return null;
        }
        if (!response.ok) {
          failed("HTTP " + response.status);
          return null;
        }
        return response.json().then(function (answer) {
          if (answer.stamp !== stamp) {
            say("updating…");
            window.location.reload();
          } else {
            delay = base;
            schedule();
          }
        });
      })
      .catch(function () {
        failed("scheduler unreachable");
      });
  }

  if (url && stamp) {
    schedule();
  }
})();
