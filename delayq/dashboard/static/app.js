// delayq dashboard: the little JavaScript it has. Pages work without it; it adds
// live refresh of [data-live-url] blocks and "select all" for dead letters.
"use strict";
(function () {
  function live(el) {
    var url = el.getAttribute("data-live-url");
    var seconds = parseFloat(el.getAttribute("data-live-seconds") || "5");
    if (!url || !(seconds > 0)) return;
    var busy = false;
    setInterval(function () {
      if (busy || document.hidden) return;
      busy = true;
      fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) { el.innerHTML = html; el.classList.remove("live-off"); })
        .catch(function () { el.classList.add("live-off"); })
        .then(function () { busy = false; });
    }, seconds * 1000);
  }
  function selectAll(box) {
    box.addEventListener("change", function () {
      var form = box.closest("form");
      form.querySelectorAll('input[type=checkbox][name=id]').forEach(function (cb) {
        cb.checked = box.checked;
      });
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live-url]").forEach(live);
    document.querySelectorAll("[data-select-all]").forEach(selectAll);
  });
})();
