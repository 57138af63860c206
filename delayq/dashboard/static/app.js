// delayq dashboard: the little JavaScript it has. Pages work without it; it adds
// live refresh of [data-live-url] blocks and "select all" for dead letters.
"use strict";
(function () {
  // A refresh never moves rows under the pointer: it waits while the pointer or the
  // keyboard focus is in one of the block's lists (or its links and buttons).
  function holding(el) {
    var lists = el.querySelectorAll("table, .pager, .jump");
    for (var i = 0; i < lists.length; i++) {
      if (lists[i].matches(":hover") || lists[i].contains(document.activeElement)) return true;
    }
    return false;
  }
  function live(el) {
    var url = el.getAttribute("data-live-url");
    var seconds = parseFloat(el.getAttribute("data-live-seconds") || "5");
    if (!url || !(seconds > 0)) return;
    var busy = false;
    setInterval(function () {
      if (busy || document.hidden) return;
      if (holding(el)) { el.setAttribute("data-live-paused", "pointer"); return; }
      el.removeAttribute("data-live-paused");
      busy = true;
      fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          // the pointer may have come in while the fetch ran: keep what it points at
          if (holding(el)) { el.setAttribute("data-live-paused", "pointer"); return; }
          el.innerHTML = html; el.classList.remove("live-off");
        })
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
