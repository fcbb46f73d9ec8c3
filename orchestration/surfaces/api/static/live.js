/* Live updates of a run page, the one thing the dashboard does with JavaScript: while the
   run lives, fetch the page every 3 s and swap its #live part in place (no reload).
   Everything else works without it. Served from /dashboard/static: the pages' policy
   (Content-Security-Policy script-src 'self') runs no inline script. */
(function () {
  "use strict";
  var every = 3000;
  function tick() {
    fetch(location.pathname, {credentials: "same-origin"})
      .then(function (reply) { return reply.ok ? reply.text() : null; })
      .then(function (html) {
        var next = html && new DOMParser().parseFromString(html, "text/html").getElementById("live");
        var here = document.getElementById("live");
        if (next && here) { here.replaceWith(next); }
        if (!next || next.dataset.terminal !== "true") { setTimeout(tick, every); }
      })
      .catch(function () { setTimeout(tick, every * 2); });
  }
  setTimeout(tick, every);
})();
