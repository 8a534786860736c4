// layerdiff report: interactive layer table and error-over-depth chart (data inlined as JSON).
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("layer-data").textContent);
  var FLOOR = 1e-12;

  function num(cell) {
    var v = cell.getValue();
    if (v === null || v === undefined || v === "") return "";
    if (v === "inf" || v === "-inf") return v;
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return String(v);
    return Number(v.toPrecision(4)).toString();
  }
  function numSorter(a, b) {
    var x = a === "inf" ? Infinity : a === "-inf" ? -Infinity : a === null ? -Infinity : a;
    var y = b === "inf" ? Infinity : b === "-inf" ? -Infinity : b === null ? -Infinity : b;
    return x - y;
  }
  function choices(field) {
    var seen = {};
    data.rows.forEach(function (r) { seen[r[field]] = true; });
    return Object.keys(seen).sort();
  }
  var textFields = {run: 1, key: 1, op_type: 1, status: 1, shape: 1, run_shape: 1, reasons: 1, isolated_status: 1};
  var columns = data.columns.map(function (field) {
    var col = {title: field, field: field, headerTooltip: field};
    if (field === "run" || field === "op_type" || field === "status") {
      col.headerFilter = "list";
      col.headerFilterParams = {values: [""].concat(choices(field)), clearable: true};
      col.headerFilterFunc = "=";
    } else if (field === "key") {
      col.headerFilter = "input";
    }
    if (!textFields[field]) { col.formatter = num; col.sorter = numSorter; col.hozAlign = "right"; }
    if (field === "status") {
      col.formatter = function (cell) { cell.getElement().classList.add("s-" + cell.getValue()); return cell.getValue(); };
    }
    return col;
  });
  var table = new Tabulator("#layer-table", {
    data: data.rows, columns: columns, height: "520px", layout: "fitDataStretch",
    renderVertical: "virtual", initialSort: [{column: "position", dir: "asc"}],
    placeholder: "no layer matches"
  });
  var search = document.getElementById("layer-search");
  function applySearch() {
    var q = search.value.trim().toLowerCase();
    if (!q) { table.clearFilter(false); return; }
    table.setFilter(function (row) {
      return String(row.key).toLowerCase().indexOf(q) >= 0 || String(row.op_type).toLowerCase().indexOf(q) >= 0 ||
        String(row.reasons || "").toLowerCase().indexOf(q) >= 0;
    });
  }
  search.addEventListener("input", applySearch);
  table.on("tableBuilt", function () {
    // `#status=fail&op_type=Conv` in the address opens the table filtered (links from findings, tests)
    new URLSearchParams(location.hash.slice(1)).forEach(function (value, field) {
      if (field === "search") { search.value = value; applySearch(); }
      else if (data.columns.indexOf(field) >= 0) table.setHeaderFilterValue(field, value);
    });
  });

  // Error over depth: one series per run, log y, drag to zoom, double-click to reset.
  var chart = data.chart;
  var el = document.getElementById("error-chart");
  if (!chart.x.length || !window.uPlot) return;
  var palette = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#ad1457"];
  var series = [{label: "layer", value: function (u, i) { return i === null ? "" : chart.keys[i] || i; }}];
  chart.runs.forEach(function (name, k) {
    series.push({label: name, stroke: palette[k % palette.length], width: 1.2, spanGaps: false,
                 points: {show: false},
                 value: function (u, v) { return v === null ? "" : Number(v.toPrecision(4)).toString(); }});
  });
  var plot = new uPlot({
    title: chart.title, width: Math.min(el.clientWidth || 1100, 1150), height: 360,
    scales: {x: {time: false}, y: {distr: 3, log: 10}},
    axes: [{label: "layer (execution order)"}, {label: chart.metric + " vs reference (log)",
            values: function (u, ticks) { return ticks.map(function (t) { return t == null ? "" : t.toExponential(0); }); }}],
    cursor: {drag: {x: true, y: false}},
    series: series
  }, [chart.x].concat(chart.y.map(function (ys) { return ys.map(function (v) { return v === null ? null : Math.max(v, FLOOR); }); })), el);
  el.addEventListener("dblclick", function () { plot.setScale("x", {min: chart.x[0], max: chart.x[chart.x.length - 1]}); });
  window.layerdiffReport = {table: table, chart: plot};
})();
