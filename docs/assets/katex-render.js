// Renders the math that pymdownx.arithmatex marks (class "arithmatex": \( \) inline, \[ \] display)
// with the vendored KaTeX (docs/assets/katex/), so the pages need no network. `document$` is
// Material's page-load stream (it also fires on instant navigation).
document$.subscribe(({ body }) => {
  for (const el of body.querySelectorAll(".arithmatex")) {
    renderMathInElement(el, {
      delimiters: [
        { left: "\\[", right: "\\]", display: true },
        { left: "\\(", right: "\\)", display: false },
      ],
      throwOnError: false,
    });
  }
});
