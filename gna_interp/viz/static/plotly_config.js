// Before plotly.js in a notebook: no MathJax script to fetch.
window.PlotlyConfig = {MathJaxConfig: "local"};
