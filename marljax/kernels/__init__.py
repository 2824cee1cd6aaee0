"""Pure-array credit-assignment and loss kernels (filled in below)."""
