// txmq console: keep the live region from being replaced while the operator is choosing dead letters.
document.addEventListener("htmx:beforeRequest", function (event) {
  var live = event.detail.elt;
  if (live && live.id === "live" && live.querySelector("input[type=checkbox]:checked")) {
    event.preventDefault();
  }
});
