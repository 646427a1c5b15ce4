"""One module per pipeline operation; each takes its dependencies (metadata, tier 1, tier 2) explicitly."""
