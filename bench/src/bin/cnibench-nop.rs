//! The start-up floor of the benchmarks: a static program that does nothing. Exec'd the same
//! way as a plugin, it measures what creating, loading and reaping any process costs here.

fn main() {}
