"""Development tooling of dsv4-operator (the `dsv4-dev` distribution): nothing here is in an
image, and nothing in `dsv4_operator` imports it."""
