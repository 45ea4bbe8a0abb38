//! `nsq-dedupe manpage`: the man pages in roff, generated from the flag definitions.

use std::io;
use std::path::Path;

use anyhow::Context as _;

/// Prints the top-level page on stdout, or with `dir` writes every page into it (created when
/// missing): `nsq-dedupe.1` and one per subcommand, `nsq-dedupe-run.1` and so on, printing
/// each path written.
pub(crate) fn run(definition: clap::Command, dir: Option<&Path>) -> anyhow::Result<()> {
    // The footer names the program and its version on every page, not the subcommand's name.
    let source = format!("nsq-dedupe {}", crate::cli::VERSION);
    // `help` is a subcommand clap adds; `nsq-dedupe --help` covers it.
    let mut definition = definition.disable_help_subcommand(true);
    let Some(dir) = dir else {
        // Rendered in memory, then written with a fallible write: a closed stdout is an error,
        // not a panic.
        let mut page = Vec::new();
        clap_mangen::Man::new(definition)
            .source(source)
            .render(&mut page)?;
        return Ok(crate::cmd::output::write_stdout(&page)?);
    };
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the `--dir` {}", dir.display()))?;
    definition.build();
    let mut written = Vec::new();
    write_pages(&definition, &source, dir, &mut written)?;
    Ok(crate::cmd::output::write_stdout(&written)?)
}

/// The page of `command`, then those of its subcommands.
fn write_pages(
    command: &clap::Command,
    source: &str,
    dir: &Path,
    out: &mut impl io::Write,
) -> anyhow::Result<()> {
    let page = clap_mangen::Man::new(command.clone()).source(source);
    let path = dir.join(page.get_filename());
    page.generate_to(dir)
        .with_context(|| format!("cannot write the man page {}", path.display()))?;
    writeln!(out, "{}", path.display())?;
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        write_pages(sub, source, dir, out)?;
    }
    Ok(())
}
