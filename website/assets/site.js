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
