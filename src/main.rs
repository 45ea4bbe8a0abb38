//! The `nsq-dedupe` binary. Its flags and subcommands are built into the library behind the
//! `cli` feature (`src/cli` and `src/cmd`), where they reach the crate's internals without
//! making them part of the library's API.

fn main() -> std::process::ExitCode {
    nsq_dedupe::binary_main()
}
