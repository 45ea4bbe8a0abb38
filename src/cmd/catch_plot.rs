//! `size --plot FILE.svg`: the catch probability of a copy against its delay, one curve per way
//! count at the same memory, drawn as SVG with `plotters`.
//!
//! The x axis is the delay on a log scale (seconds with `--rate`, else distinct messages), from
//! a thousandth of the window to ten windows; the y axis is the probability. The window and
//! the probability the chosen table reaches there are marked, and beyond `--max-age` every
//! curve is 0.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use plotters::coord::combinators::{LogCoord, WithKeyPoints};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::sizing;
use crate::units::{format_bytes, format_count, format_duration};
use crate::Geometry;

/// Picture size in pixels.
const SIZE: (u32, u32) = (800, 480);
/// Points per curve, evenly spaced on the log axis.
const POINTS: usize = 240;

/// The picture's chart: a log x axis with round ticks, a linear y axis.
type Chart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<WithKeyPoints<LogCoord<f64>>, RangedCoordf64>>;

/// Why the picture could not be drawn.
type DrawError = Box<dyn std::error::Error + Send + Sync>;

/// What the picture shows.
#[derive(Debug)]
pub(crate) struct CatchPlot {
    /// The table chosen by the sizing question; the other curves have its memory.
    pub geometry: Geometry,
    /// The window, in distinct messages.
    pub window_messages: f64,
    /// Distinct messages per second, when known: then the x axis is in seconds.
    pub rate: Option<f64>,
    /// `--max-age` in seconds: copies later than it pass.
    pub max_age_seconds: Option<f64>,
}

impl CatchPlot {
    /// The curves' tables: 1, 2, 4 and 8 ways in the chosen table's memory.
    fn tables(&self) -> Vec<Geometry> {
        Geometry::SUPPORTED_WAYS
            .iter()
            .filter_map(|&ways| Geometry::with_memory(self.geometry.memory_bytes(), ways).ok())
            .collect()
    }

    /// The probability that a copy `messages` later is caught by `table`.
    fn catch_probability(&self, table: Geometry, messages: f64) -> f64 {
        match (self.max_age_seconds, self.rate) {
            (Some(max_age), Some(rate)) if messages / rate > max_age => 0.0,
            _ => sizing::catch_probability(table, messages),
        }
    }

    /// x (seconds or messages) of a delay in messages.
    fn x(&self, messages: f64) -> f64 {
        self.rate.map_or(messages, |rate| messages / rate)
    }

    /// Round delays for the x axis's labels: durations people say (1s, 1m, 1h, 1d…) with
    /// `--rate`, else powers of ten messages.
    fn ticks(&self, first: f64, last: f64) -> Vec<f64> {
        const DAY: f64 = 86_400.0;
        let candidates: Vec<f64> = match self.rate {
            Some(_) => vec![
                0.001,
                0.01,
                0.1,
                1.0,
                10.0,
                60.0,
                600.0,
                3600.0,
                6.0 * 3600.0,
                DAY,
                7.0 * DAY,
                30.0 * DAY,
                365.0 * DAY,
                3650.0 * DAY,
            ],
            None => (0..=18).map(|e| 10f64.powi(e)).collect(),
        };
        candidates
            .into_iter()
            .filter(|x| (first..=last).contains(x))
            .collect()
    }

    /// Writes the picture to `path`.
    pub(crate) fn write_svg(&self, path: &Path) -> Result<()> {
        let mut svg = String::new();
        self.draw(&mut svg)
            .map_err(|e| anyhow::anyhow!("cannot draw the plot: {e}"))?;
        std::fs::write(path, svg)
            .with_context(|| format!("cannot write the plot to {}", path.display()))
    }

    fn draw(&self, svg: &mut String) -> Result<(), DrawError> {
        let first = (self.window_messages / 1e3).max(1.0);
        let last = (self.window_messages * 10.0).max(first * 10.0);
        let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = self.axes(&root, self.x(first), self.x(last))?;
        self.draw_curves(&mut chart, first, last)?;
        self.mark_window(&mut chart, self.x(first), self.x(last))?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.3))
            .draw()?;
        root.present()?;
        Ok(())
    }

    /// The caption and the axes, from `x_first` to `x_last` on a log scale.
    fn axes<'a, 'b>(
        &self,
        root: &'a DrawingArea<SVGBackend<'b>, Shift>,
        x_first: f64,
        x_last: f64,
    ) -> Result<Chart<'a, 'b>, DrawError> {
        let caption = format!(
            "Catch probability of a copy against its delay, {} table",
            format_bytes(self.geometry.memory_bytes())
        );
        let mut chart = ChartBuilder::on(root)
            .caption(caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d(
                (x_first..x_last)
                    .log_scale()
                    .with_key_points(self.ticks(x_first, x_last)),
                0.0..1.0,
            )?;
        let rate = self.rate;
        chart
            .configure_mesh()
            .x_desc(match rate {
                Some(_) => "delay of the copy (log scale)",
                None => "delay of the copy, in distinct messages (log scale)",
            })
            .y_desc("probability the copy is caught")
            .x_label_formatter(&|x| match rate {
                Some(_) => format_duration(Duration::from_secs_f64(x.max(0.0))),
                None => format_count(x.round() as u64),
            })
            .y_label_formatter(&|y| format!("{y:.1}"))
            .draw()?;
        Ok(chart)
    }

    /// One curve per way count, from a delay of `first` to `last` messages; the chosen
    /// table's is drawn thick.
    fn draw_curves(&self, chart: &mut Chart, first: f64, last: f64) -> Result<(), DrawError> {
        let colours = [RED, MAGENTA, BLUE, BLACK];
        for (table, colour) in self.tables().into_iter().zip(colours) {
            let step = (last / first).ln() / (POINTS - 1) as f64;
            let points = (0..POINTS).map(|i| {
                let messages = first * (step * i as f64).exp();
                (self.x(messages), self.catch_probability(table, messages))
            });
            let ways = table.ways();
            let chosen = if ways == self.geometry.ways() {
                " (chosen)"
            } else {
                ""
            };
            let label = match ways {
                1 => format!("1 way (classic){chosen}"),
                _ => format!("{ways} ways{chosen}"),
            };
            let width = if chosen.is_empty() { 1 } else { 3 };
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(width)))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(width))
                });
        }

        Ok(())
    }

    /// The sizing question's answer: the window, and what the chosen table reaches there
    /// (nothing, when the window is later than max_age); and where max_age begins.
    fn mark_window(&self, chart: &mut Chart, x_first: f64, x_last: f64) -> Result<(), DrawError> {
        let rate = self.rate;
        let window = self.x(self.window_messages);
        let probability = self.catch_probability(self.geometry, self.window_messages);
        let grey = BLACK.mix(0.4);
        chart.draw_series(DashedLineSeries::new(
            [(window, 0.0), (window, 1.0)],
            6,
            4,
            grey.stroke_width(1),
        ))?;
        chart.draw_series(DashedLineSeries::new(
            [(x_first, probability), (x_last, probability)],
            6,
            4,
            grey.stroke_width(1),
        ))?;
        let mark = format!(
            "the dot: caught with {} a whole window ({}) late",
            super::format_probability(probability),
            match rate {
                Some(_) => format_duration(Duration::from_secs_f64(window)),
                None => format!("{} messages", format_count(window.round() as u64)),
            }
        );
        chart.draw_series([Circle::new((window, probability), 5, BLACK.filled())])?;
        chart.draw_series([Text::new(
            mark,
            // Left of the point, where every curve is still near 1, and above the legend.
            (x_first * 1.3, (probability - 0.07).max(0.3)),
            ("sans-serif", 14),
        )])?;

        if let Some(max_age) = self.max_age_seconds.filter(|_| rate.is_some()) {
            chart.draw_series([Text::new(
                format!(
                    "later than max age ({}): passes",
                    format_duration(Duration::from_secs_f64(max_age))
                ),
                (max_age * 1.15, 0.5),
                ("sans-serif", 14),
            )])?;
        }
        Ok(())
    }
}
