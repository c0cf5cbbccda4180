// conv2d-days: click a notebook figure to see it at its full size; click again or press Escape to close.
document.addEventListener("click", (event) => {
  const open = document.querySelector(".c2d-lightbox");
  if (open) { open.remove(); return; }
  const img = event.target.closest(".jp-OutputArea-output img");
  if (!img) return;
  const box = document.createElement("div");
  box.className = "c2d-lightbox";
  const big = document.createElement("img");
  big.src = img.currentSrc || img.src;
  big.alt = img.alt;
  box.appendChild(big);
  document.body.appendChild(box);
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") document.querySelector(".c2d-lightbox")?.remove();
});

// A code cell that draws a figure (its output holds an image, its code calls matplotlib) shows
// the figure and folds its code under "the plotting code": the figure is what the reader came for.
document.querySelectorAll(".jp-CodeCell").forEach((cell) => {
  const input = cell.querySelector(".jp-Cell-inputWrapper");
  const code = input ? input.textContent : "";
  if (!input || !cell.querySelector(".jp-OutputArea-output img") || !/\b(plt|ax|axes|fig)\./.test(code)) return;
  const fold = document.createElement("details");
  fold.className = "c2d-plot-code";
  const summary = document.createElement("summary");
  summary.textContent = "the plotting code";
  fold.appendChild(summary);
  input.parentNode.insertBefore(fold, input);
  fold.appendChild(input);
});
