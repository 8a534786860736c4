"""collector/inputs."""
