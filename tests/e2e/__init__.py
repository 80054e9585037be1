"""End-to-end tests against real `ferrollm serve` processes (a package: its servers live for
the package's tests only)."""
