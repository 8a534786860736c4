"""layerdiff."""
