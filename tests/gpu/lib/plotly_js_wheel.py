"""A wheel holding only plotly.js out of the plotly wheel: package `plotly` with package_data/plotly.min.js.

layerdiff's report inlines that file and nothing else of plotly (analyzer/report/charts.py: plotly_js,
found with importlib.util.find_spec, never imported); the whole plotly wheel is 9.7 MB, this one 1.4 MB.
Usage: plotly_js_wheel.py PLOTLY_WHEEL OUTDIR
"""
import base64
import hashlib
import sys
import zipfile
from pathlib import Path

source, outdir = Path(sys.argv[1]), Path(sys.argv[2])
version = source.name.split("-")[1]
name = "plotly_js_only"
with zipfile.ZipFile(source) as whl:
    js = whl.read("plotly/package_data/plotly.min.js")
init = (f'"""plotly.js {version} only (plotly/package_data/plotly.min.js), carried for layerdiff\'s HTML report;\n'
        'the plotly Python API is not here."""\n'
        'raise ImportError("this is a plotly.js-only stand-in for layerdiff reports; the plotly Python API is not installed")\n').encode()
dist = f"{name}-{version}.dist-info"
files = {
    "plotly/__init__.py": init,
    "plotly/package_data/plotly.min.js": js,
    f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: plotly.min.js from plotly {version} only\n".encode(),
    f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: layerdiff tests/gpu/lib/plotly_js_wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    f"{dist}/top_level.txt": b"plotly\n",
}
def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"
record = "\n".join([record_line(p, d) for p, d in files.items()] + [f"{dist}/RECORD,,"]) + "\n"
target = outdir / f"{name}-{version}-py3-none-any.whl"
with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
    for path, data in files.items():
        out.writestr(path, data)
    out.writestr(f"{dist}/RECORD", record)
print(target, target.stat().st_size)
