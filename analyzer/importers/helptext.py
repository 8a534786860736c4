"""What `analyze import`'s help says about each foreign format's options: the formats are named after the tools
that write them, so their words live with their readers (this module imports nothing: `--help` reads it)."""

SOURCE = ("Dump to import: raw dump dir, .h5, MNN output dir, Polygraphy .json, .npz, .npy dir, Paddle-Lite precision "
          "profiler dir or model_debug_tool tensor file, or a .zip of one")
SHAPES_FILE = "MNN: saved console log or shapes.json giving tensor shapes"
RUNNER = "Polygraphy: runner name (or part of it) or index"
ITERATION = "Polygraphy: iteration index"
INCLUDE_INPUTS = "MNN: also import the Input_<op>_<i> dumps"
TOPO_FILE = "Paddle-Lite model_debug_tool: its topology file (default: topo_file.txt beside the tensor file)"
