// Sort by clicking a header (numbers as numbers, empty cells last), filter by text, show only failing rows.
(function () {
  const table = document.querySelector("table.summary");
  if (!table) return;
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  const filter = document.getElementById("filter");
  const failing = document.getElementById("only-failing");
  const count = document.getElementById("row-count");
  function value(row, i) {
    const cell = row.cells[i];
    const raw = cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent;
    if (raw.trim() === "") return null;
    const num = parseFloat(raw);
    return isNaN(num) && !/^[-+]?inf/i.test(raw) ? raw.toLowerCase() : (/^-inf/i.test(raw) ? -Infinity : (/^\+?inf/i.test(raw) ? Infinity : num));
  }
  Array.from(table.tHead.rows[0].cells).forEach(function (th, i) {
    th.addEventListener("click", function () {
      const asc = !th.classList.contains("sorted-asc");
      Array.from(th.parentNode.cells).forEach(c => c.classList.remove("sorted-asc", "sorted-desc"));
      th.classList.add(asc ? "sorted-asc" : "sorted-desc");
      rows.sort(function (a, b) {
        const x = value(a, i), y = value(b, i);
        if (x === y) return 0;
        if (x === null) return 1;
        if (y === null) return -1;
        return (x > y ? 1 : -1) * (asc ? 1 : -1);
      });
      rows.forEach(r => body.appendChild(r));
    });
  });
  function apply() {
    const text = filter.value.toLowerCase();
    let shown = 0;
    rows.forEach(function (r) {
      const ok = (!text || r.textContent.toLowerCase().includes(text)) && (!failing.checked || r.classList.contains("fail"));
      r.style.display = ok ? "" : "none";
      if (ok) shown += 1;
    });
    count.textContent = shown + " of " + rows.length + " layers";
  }
  filter.addEventListener("input", apply);
  failing.addEventListener("change", apply);
  apply();
})();
