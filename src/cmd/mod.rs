//! The subcommands of the binary: each module turns parsed flags into output, after
//! [`std_streams`] confirmed that the streams it uses were open when the process started.

mod catch_plot;
pub(crate) mod completions;
pub(crate) mod entry;
pub(crate) mod filter;
pub(crate) mod manpage;
mod measured_rate;
mod nsqd_stats;
pub(crate) mod output;
pub(crate) mod resize;
pub(crate) mod run;
pub(crate) mod size;
mod size_cost;
pub(crate) mod std_streams;

/// A probability with six decimals, or as many more as it takes to tell it from 1 (or from 0):
/// 0.999999999 must not print as 1.000000. Past twelve nines the difference is below what
/// the sizing maths resolves, and it prints as `> 0.999999999999`.
pub(crate) fn format_probability(p: f64) -> String {
    if p >= 1.0 {
        return "1".to_owned();
    }
    if p > 0.0 && p < 1e-6 {
        return format!("{p:.2e}");
    }
    (6..=12)
        .map(|digits| format!("{p:.digits$}"))
        .find(|text| !text.starts_with('1'))
        .unwrap_or_else(|| "> 0.999999999999".to_owned())
}

#[cfg(test)]
mod tests {
    use super::format_probability;

    #[test]
    fn probabilities_near_one_keep_their_digits() {
        assert_eq!(format_probability(0.9), "0.900000");
        assert_eq!(format_probability(0.999999999), "0.999999999");
        assert_eq!(format_probability(0.9999996), "0.9999996");
        assert_eq!(format_probability(1.0), "1");
        assert_eq!(format_probability(1.0 - 2e-16), "> 0.999999999999");
        assert_eq!(format_probability(0.0), "0.000000");
        assert_eq!(format_probability(3e-9), "3.00e-9");
    }
}
