// layerdiff report: the layer table. DataTables comes from the itables bundle inlined (base64) in
// #dt-bundle; the rows come from the JSON island #layer-data. Scroller draws only the visible rows.
(async function () {
  "use strict";
  var source = atob(document.getElementById("dt-bundle").textContent.trim());
  var url = URL.createObjectURL(new Blob([source], {type: "text/javascript"}));
  var DataTable = (await import(url)).default;
  URL.revokeObjectURL(url);
  var data = JSON.parse(document.getElementById("layer-data").textContent);
  var TEXT = {run: 1, key: 1, op_type: 1, status: 1, shape: 1, run_shape: 1, permutation: 1, reasons: 1, isolated_status: 1,
              estimated: 1};
  var PANES = ["run", "op_type", "status"];

  function number(value, type) {  // 4 significant digits on screen, the exact value for sorting
    if (value === null || value === undefined) return type === "sort" || type === "type" ? -Infinity : "";
    if (value === "inf" || value === "-inf" || value === "nan") {
      return type === "sort" || type === "type" ? (value === "-inf" ? -Infinity : Infinity) : value;
    }
    if (typeof value !== "number") {  // a text where a number was expected: "0.012 ± 0.0004 (estimated)" sorts by 0.012
      var lead = type === "sort" || type === "type" ? /-?\d[\d.]*(e[-+]?\d+)?/.exec(String(value)) : null;
      return lead ? parseFloat(lead[0]) : text(value, type);
    }
    if (type !== "display" || Number.isInteger(value)) return value;
    return Number(value.toPrecision(4)).toString();
  }
  var ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"};
  function text(value, type) {  // names are data: DataTables writes "display" values as HTML, so escape them
    if (value === null || value === undefined) return "";
    return type === "display" ? String(value).replace(/[&<>"']/g, function (c) { return ENTITIES[c]; }) : value;
  }
  var columns = data.columns.map(function (field, index) {
    var column = {data: index, title: field, defaultContent: "", render: text};
    if (!TEXT[field]) { column.render = number; column.className = "dt-right"; column.type = "num"; }
    if (!TEXT[field]) column.createdCell = function (td, value) {  // a figure from a summary: shown apart
      if (typeof value === "string" && / \(estimated\)$/.test(value)) td.className += " estimate";
    };
    if (field === "status") column.createdCell = function (td, value) { td.className += " s-" + String(value).replace(/\W/g, ""); };
    if (field === "position") {  // shown 1-based, as the findings' "#N in execution order" (the data stays 0-based)
      column.title = "#";
      column.render = function (value, type) { return type === "display" && typeof value === "number" ? value + 1 : value; };
    }
    return column;
  });
  var table = new DataTable("#layer-table", {
    data: data.rows, columns: columns, deferRender: true, scroller: true, scrollY: "520px", scrollX: true,
    order: [[data.columns.indexOf("run"), "asc"], [data.columns.indexOf("position"), "asc"]],
    layout: {top1: "searchPanes", topStart: "info", topEnd: "search", bottomStart: null, bottomEnd: null},
    searchPanes: {columns: PANES.map(function (f) { return data.columns.indexOf(f); }), layout: "columns-3",
                  cascadePanes: false, viewTotal: true, dtOpts: {scrollY: "110px"}},
    language: {zeroRecords: "no layer matches", search: "Search layer, op type or reason:"}
  });
  // `#status=fail&op_type=Conv` in the address opens the table filtered (links from findings, tests)
  new URLSearchParams(location.hash.slice(1)).forEach(function (value, field) {
    if (field === "search") { table.search(value); return; }
    var index = data.columns.indexOf(field);
    if (index >= 0) table.column(index).search(function (cell) { return String(cell) === value; });
  });
  table.draw();
  window.layerdiffReport = {table: table};
})();
