"""The job's stages, one module each (the runner calls them in order): import, optimize, quantize,
tune, build, inspect, benchmark, remote."""
