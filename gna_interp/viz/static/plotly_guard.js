// After a notebook figure (gna_interp.viz.notebook): where the page has no plotly.js, say so in the figure's place
// (the message is this script's data-missing attribute) instead of staying blank.
if (typeof window.Plotly === "undefined") {
  document.currentScript.previousElementSibling.insertAdjacentText("beforeend", document.currentScript.dataset.missing);
}
