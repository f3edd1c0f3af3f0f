// Inside a notebook's <iframe srcdoc>: size the frame to its content (srcdoc frames share the notebook's origin).
// It measures the body, not documentElement.scrollHeight, which never drops below the frame's own height.
(function () {
  var f = window.frameElement;
  if (!f) return;
  var b = document.body;
  function fit() {
    var m = parseFloat(getComputedStyle(b).marginBottom) || 0;
    f.style.height = Math.ceil(b.getBoundingClientRect().bottom + m + window.scrollY) + "px";
  }
  new ResizeObserver(fit).observe(b);
  window.addEventListener("load", fit);
  fit();
})();
