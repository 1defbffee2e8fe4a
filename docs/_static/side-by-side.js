// A button above a page's framework tabs that shows the frameworks side by side instead (and back), as the
// book does; the choice is kept for the next page and visit where the browser lets pages store it.
(() => {
  const KEY = "bert_multi-side-by-side";
  const LABELS = { true: "Show the frameworks as tabs", false: "Show the frameworks side by side" };

  const stored = () => {
    try {
      return window.localStorage.getItem(KEY) === "1";
    } catch (error) {
      return false;
    }
  };
  const store = (on) => {
    try {
      window.localStorage.setItem(KEY, on ? "1" : "0");
    } catch (error) {
      // Storage blocked: the choice lasts for this page only.
    }
  };

  document.addEventListener("DOMContentLoaded", () => {
    const first = document.querySelector("article .sd-tab-set");
    if (first === null) return;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "side-by-side-toggle";
    const show = (on) => {
      document.body.classList.toggle("side-by-side", on);
      button.textContent = LABELS[on];
      button.setAttribute("aria-pressed", String(on));
    };
    button.addEventListener("click", () => {
      const on = !document.body.classList.contains("side-by-side");
      store(on);
      show(on);
    });
    show(stored());
    const heading = document.querySelector("article h1");
    (heading ?? first).insertAdjacentElement(heading ? "afterend" : "beforebegin", button);
  });
})();
