"""collector/repro: `collect repro`, a failing layer packed as a bundle a maintainer runs without layerdiff."""
