//! A small, dependency-free SVG heatmap writer, for square matrices such as `c2c --matrix`'s
//! core-to-core round trips.
//!
//! Each cell is coloured on one linear scale from the smallest value (light) to the largest
//! (dark), with its value printed inside when the cells are large enough to read, and in a
//! tooltip (`<title>`: row, column, value) always. With [`ROBUST_FROM`] values or more the
//! scale runs from the 2nd to the 98th percentile instead, cells beyond it drawn at its ends
//! and the legend's ends marked `<=` / `>=`: one disturbed pair no longer bleaches the rest of
//! a large map into one shade. Rows and
//! columns may be split into groups (NUMA nodes): a line is drawn where the group changes,
//! so the blocks a multi-socket host shows stand out. A missing value (the diagonal: a CPU
//! with itself) is drawn grey and labelled `-`. Rows and columns are labelled every one while
//! the cells are as tall as the labels' font, and every second (third, ...) one on larger
//! maps (from about 180 CPUs), so the labels never overlap.

use std::{fmt::Write as _, io, path::Path};

use crate::{fmt_num, svg::esc};

/// A value as a cell prints it: whole numbers from 10 up, about four figures below.
fn num(v: f64) -> String {
    if v.abs() >= 10.0 {
        format!("{v:.0}")
    } else {
        fmt_num(v)
    }
}

/// A square matrix to draw: `values[row * n + col]`, `n = labels.len()`.
#[derive(Debug, Clone)]
pub struct Heatmap {
    /// Title at the top of the image.
    pub title: String,
    /// Smaller text under the title (machine, date, how it was measured).
    pub subtitle: String,
    /// Unit of the values, printed on the legend, e.g. `ns`.
    pub unit: String,
    /// One label per row (and the same per column), e.g. `cpu 3`.
    pub labels: Vec<String>,
    /// One group id per row, or empty for no grouping: a separator is drawn between two
    /// neighbouring rows (and columns) whose groups differ.
    pub groups: Vec<usize>,
    /// Coarser groups (packages around NUMA nodes), as `groups`: their separators are drawn
    /// thicker, so a node line and a socket line read apart.
    pub supergroups: Vec<usize>,
    /// Row-major values, `labels.len()²` of them; `None` where nothing was measured.
    pub values: Vec<Option<f64>>,
}

/// Light end of the colour scale (smallest value).
const LIGHT: (f64, f64, f64) = (255.0, 245.0, 235.0);
/// Dark end of the colour scale (largest value).
const DARK: (f64, f64, f64) = (127.0, 39.0, 4.0);
/// Colour of a cell without a value.
const MISSING: &str = "#dddddd";
/// Narrowest image: the subtitle and the legend need the room.
const MIN_WIDTH: f64 = 640.0;
/// Values from which the colour scale leaves out the lowest and highest 2 % (see the module docs).
pub const ROBUST_FROM: usize = 50;
/// Left and top margins that hold the labels.
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_TOP: f64 = 110.0;

impl Heatmap {
    /// Side of a cell in pixels: large enough to print the value up to 16 rows, smaller
    /// beyond so that the whole image stays under about 1,000 pixels.
    fn cell(n: usize) -> f64 {
        match n {
            0..=16 => 48.0,
            17..=32 => 28.0,
            _ => (900.0 / n as f64).max(4.0),
        }
    }

    /// Which rows (and columns) get a printed label: every one while the cells are at least as
    /// tall as the label's font, else every `k`-th one, spaced by at least the font's size.
    /// From about 180 rows (cells under 5 pixels, a 5-pixel font) labels printed for every row
    /// overlapped into an unreadable band; every cell still names its row and column in its
    /// tooltip, and the group lines show the structure.
    fn label_every(cell: f64, label_size: f64) -> usize {
        ((label_size / cell).ceil() as usize).max(1)
    }

    /// Checks the shape: `n²` values, `n` or no groups, at least one row.
    fn check(&self) -> io::Result<usize> {
        let n = self.labels.len();
        let bad = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        if n == 0 {
            return bad("heatmap: no rows to draw".into());
        }
        if self.values.len() != n * n {
            return bad(format!(
                "heatmap: {} values for {n} labels (wants {})",
                self.values.len(),
                n * n
            ));
        }
        for (what, g) in [("groups", &self.groups), ("supergroups", &self.supergroups)] {
            if !g.is_empty() && g.len() != n {
                return bad(format!(
                    "heatmap: {} {what} for {n} labels (wants {n}, or none)",
                    g.len()
                ));
            }
        }
        Ok(n)
    }

    /// The scale's ends, and whether values lie beyond each (clamped): the smallest and
    /// largest finite value, or with [`ROBUST_FROM`] values or more the 2nd and 98th
    /// percentiles. `None` when there is no value.
    fn range(&self) -> Option<((f64, f64), (bool, bool))> {
        let mut v: Vec<f64> = self
            .values
            .iter()
            .flatten()
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        v.sort_by(f64::total_cmp);
        let (first, last) = (*v.first()?, *v.last()?);
        if v.len() < ROBUST_FROM {
            return Some(((first, last), (false, false)));
        }
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        let (lo, hi) = (at(0.02), at(0.98));
        Some(((lo, hi), (first < lo, last > hi)))
    }

    /// Renders the heatmap as a standalone SVG document; `Err(InvalidInput)` when the shape
    /// is wrong (see the fields).
    pub fn render(&self) -> io::Result<String> {
        let n = self.check()?;
        let cell = Self::cell(n);
        let side = cell * n as f64;
        // Wide enough for the title, the subtitle and the legend however few the rows.
        let width = (MARGIN_LEFT + side + 20.0).max(MIN_WIDTH);
        let height = MARGIN_TOP + side + 70.0;
        let ((lo, hi), clamped) = self.range().unwrap_or(((0.0, 0.0), (false, false)));
        let mut s = crate::svg::open(width, height, &self.title, &self.subtitle);
        let label_size = (cell * 0.3).clamp(5.0, 12.0);
        let every = Self::label_every(cell, label_size);
        for (i, label) in self.labels.iter().enumerate() {
            if i % every != 0 {
                continue;
            }
            let mid = i as f64 * cell + cell / 2.0;
            // Row labels right-aligned left of the grid; column labels turned up above it.
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="{label_size:.1}" text-anchor="end" dominant-baseline="middle">{}</text>"#,
                MARGIN_LEFT - 6.0,
                MARGIN_TOP + mid,
                esc(label)
            );
            let (x, y) = (MARGIN_LEFT + mid, MARGIN_TOP - 6.0);
            let _ = writeln!(
                s,
                r#"<text x="{x:.1}" y="{y:.1}" font-size="{label_size:.1}" transform="rotate(-60 {x:.1} {y:.1})" dominant-baseline="middle">{}</text>"#,
                esc(label)
            );
        }
        let value_size = (cell * 0.26).min(12.0);
        for row in 0..n {
            for col in 0..n {
                let (x, y) = (
                    MARGIN_LEFT + col as f64 * cell,
                    MARGIN_TOP + row as f64 * cell,
                );
                let v = self.values[row * n + col].filter(|v| v.is_finite());
                let (fill, ink) = match v {
                    Some(v) => {
                        let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
                        (colour(t), if t > 0.55 { "white" } else { "black" })
                    }
                    None => (MISSING.to_string(), "#555"),
                };
                let tip = format!(
                    "{} / {}: {}",
                    self.labels[row],
                    self.labels[col],
                    v.map_or_else(|| "-".to_string(), |v| format!("{} {}", num(v), self.unit))
                );
                let _ = writeln!(
                    s,
                    r#"<rect x="{x:.1}" y="{y:.1}" width="{cell:.1}" height="{cell:.1}" fill="{fill}" stroke="white" stroke-width="0.5"><title>{}</title></rect>"#,
                    esc(&tip)
                );
                if cell >= 24.0 {
                    let text = v.map_or_else(|| "-".to_string(), num);
                    let _ = writeln!(
                        s,
                        r#"<text x="{:.1}" y="{:.1}" font-size="{value_size:.1}" fill="{ink}" text-anchor="middle" dominant-baseline="middle">{text}</text>"#,
                        x + cell / 2.0,
                        y + cell / 2.0
                    );
                }
            }
        }
        // Group separators, across the whole grid in both directions: a supergroup change
        // thick, else a group change thin.
        for i in 1..n {
            let changes = |g: &[usize]| !g.is_empty() && g[i] != g[i - 1];
            let width = if changes(&self.supergroups) {
                4.0
            } else if changes(&self.groups) {
                1.5
            } else {
                continue;
            };
            let at = i as f64 * cell;
            let _ = writeln!(
                s,
                r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black" stroke-width="{width}"/>"#,
                MARGIN_LEFT + at,
                MARGIN_TOP,
                MARGIN_LEFT + at,
                MARGIN_TOP + side
            );
            let _ = writeln!(
                s,
                r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black" stroke-width="{width}"/>"#,
                MARGIN_LEFT,
                MARGIN_TOP + at,
                MARGIN_LEFT + side,
                MARGIN_TOP + at
            );
        }
        legend(
            &mut s,
            MARGIN_LEFT,
            MARGIN_TOP + side + 20.0,
            (lo, hi),
            clamped,
            &self.unit,
        );
        s.push_str("</svg>\n");
        Ok(s)
    }

    /// Writes [`Heatmap::render`] to `path`, creating its parent directory if needed.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        crate::svg::write_file(path, &self.render()?)
    }
}

/// The scale under the grid: ten steps from light to dark, the scale's ends at its ends
/// (`<=` / `>=` where values beyond were drawn at them) and its middle value between.
fn legend(
    s: &mut String,
    x0: f64,
    y0: f64,
    (lo, hi): (f64, f64),
    (below, above): (bool, bool),
    unit: &str,
) {
    const STEPS: usize = 10;
    const STEP_W: f64 = 20.0;
    for i in 0..STEPS {
        let t = i as f64 / (STEPS - 1) as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{y0:.1}" width="{STEP_W}" height="12" fill="{}"/>"#,
            x0 + i as f64 * STEP_W,
            colour(t)
        );
    }
    let mark = |beyond: bool, sign: &'static str| if beyond { sign } else { "" };
    let _ = writeln!(
        s,
        r#"<text x="{x0:.1}" y="{:.1}" font-size="11">{}{} {}</text>"#,
        y0 + 28.0,
        esc(mark(below, "<= ")),
        num(lo),
        esc(unit)
    );
    if hi == lo {
        // One value: one label.
        return;
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
        x0 + STEPS as f64 * STEP_W / 2.0,
        y0 + 28.0,
        num((lo + hi) / 2.0)
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}{} {}</text>"#,
        x0 + STEPS as f64 * STEP_W,
        y0 + 28.0,
        esc(mark(above, ">= ")),
        num(hi),
        esc(unit)
    );
}

/// The colour at `t` in 0..=1 (clamped) on the light-to-dark scale, as `#rrggbb`.
fn colour(t: f64) -> String {
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    let mix = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(LIGHT.0, DARK.0),
        mix(LIGHT.1, DARK.1),
        mix(LIGHT.2, DARK.2)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_by_two() -> Heatmap {
        Heatmap {
            title: "c2c <matrix>".into(),
            subtitle: "test".into(),
            unit: "ns".into(),
            labels: vec!["cpu 0".into(), "cpu 1".into()],
            groups: vec![0, 1],
            supergroups: Vec::new(),
            values: vec![None, Some(100.0), Some(300.0), None],
        }
    }

    #[test]
    fn renders_one_cell_per_value_with_the_scale_and_separators() {
        let svg = two_by_two().render().unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        // The background, four cells and the ten-step legend.
        assert_eq!(svg.matches("<rect ").count(), 1 + 4 + 10);
        // The smallest value gets the light end, the largest the dark end.
        assert!(svg.contains(&format!(r#"fill="{}""#, colour(0.0))));
        assert!(svg.contains(&format!(r#"fill="{}""#, colour(1.0))));
        assert_eq!(svg.matches(&format!(r#"fill="{MISSING}""#)).count(), 2);
        assert!(svg.contains(">100<") && svg.contains(">300<"));
        // One group change: a vertical and a horizontal separator.
        assert_eq!(svg.matches("<line ").count(), 2);
        assert!(svg.contains("c2c &lt;matrix&gt;"));
    }

    #[test]
    fn no_separators_without_groups_or_within_one() {
        let mut h = two_by_two();
        h.groups.clear();
        assert_eq!(h.render().unwrap().matches("<line ").count(), 0);
        h.groups = vec![3, 3];
        assert_eq!(h.render().unwrap().matches("<line ").count(), 0);
    }

    #[test]
    fn refuses_a_wrong_shape() {
        let mut h = two_by_two();
        h.values.pop();
        let e = h.render().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("3 values for 2 labels"), "{e}");
        let mut h = two_by_two();
        h.groups = vec![0];
        assert!(h.render().is_err());
        let mut h = two_by_two();
        h.labels.clear();
        h.values.clear();
        assert!(h.render().is_err());
    }

    #[test]
    fn equal_values_and_no_values_still_render() {
        let mut h = two_by_two();
        h.values = vec![None, Some(5.0), Some(5.0), None];
        let svg = h.render().unwrap();
        assert_eq!(
            svg.matches(&format!(r#"fill="{}""#, colour(0.5))).count(),
            2
        );
        // The legend names the one value once.
        assert_eq!(svg.matches(">5.000 ns<").count(), 1);
        h.values = vec![None; 4];
        assert!(h.render().is_ok());
    }

    /// One disturbed pair in a large map: the scale leaves it out, so the levels below it keep
    /// their own shades (min-max, the three levels all came out near the light end).
    #[test]
    fn one_outlier_does_not_bleach_a_large_map() {
        let n = 16;
        let mut values: Vec<Option<f64>> = (0..n * n)
            .map(|i| {
                (i / n != i % n).then_some(if (i / n < 8) == (i % n < 8) {
                    100.0
                } else {
                    400.0
                })
            })
            .collect();
        values[1] = Some(40_000.0);
        let h = Heatmap {
            title: "outlier".into(),
            subtitle: String::new(),
            unit: "ns".into(),
            labels: (0..n).map(|i| i.to_string()).collect(),
            groups: (0..n).map(|i| i / 8).collect(),
            supergroups: Vec::new(),
            values,
        };
        let ((lo, hi), (below, above)) = h.range().unwrap();
        assert_eq!((lo, hi, below, above), (100.0, 400.0, false, true));
        let svg = h.render().unwrap();
        assert!(svg.contains(&format!(r#"fill="{}""#, colour(0.0))));
        assert!(svg.contains(&format!(r#"fill="{}""#, colour(1.0))));
    }

    #[test]
    fn colours_run_from_light_to_dark_and_clamp() {
        assert_eq!(colour(0.0), "#fff5eb");
        assert_eq!(colour(1.0), "#7f2704");
        assert_eq!(colour(-1.0), colour(0.0));
        assert_eq!(colour(2.0), colour(1.0));
        assert_eq!(colour(f64::NAN), colour(0.0));
    }

    #[test]
    fn large_matrices_drop_the_printed_values() {
        let n = 40;
        let h = Heatmap {
            title: "big".into(),
            subtitle: String::new(),
            unit: "ns".into(),
            labels: (0..n).map(|i| format!("{i}")).collect(),
            groups: (0..n).map(|i| i / 10).collect(),
            supergroups: (0..n).map(|i| i / 20).collect(),
            values: (0..n * n).map(|i| Some(i as f64)).collect(),
        };
        let svg = h.render().unwrap();
        assert_eq!(svg.matches("<rect ").count(), 1 + n * n + 10);
        // Only labels and the legend's three ticks are text; no cell values (they are in the
        // cells' tooltips).
        assert_eq!(svg.matches("<text ").count(), 2 + 2 * n + 3);
        assert_eq!(svg.matches("<title>").count(), n * n);
        assert!(svg.contains("<title>3 / 4: 124 ns</title>"));
        // 40 rows: 22.5-pixel cells, every label printed.
        assert!(svg.contains(">39</text>"));
        // 1,600 values: the scale runs from the 2nd to the 98th percentile, its ends marked.
        assert!(
            svg.contains(">&lt;= 32 ns<") && svg.contains(">&gt;= 1567 ns<"),
            "{svg}"
        );
        // Three group changes, two lines each: the one that is also a supergroup change thick.
        assert_eq!(svg.matches("<line ").count(), 6);
        assert_eq!(svg.matches(r#"stroke-width="4""#).count(), 2);
        assert_eq!(svg.matches(r#"stroke-width="1.5""#).count(), 4);
    }

    /// With more rows than the labels' font fits (a 256-CPU host's matrix: 4-pixel cells,
    /// a 5-pixel font), every second label is printed, and printed labels never overlap.
    #[test]
    fn labels_of_many_rows_are_thinned_so_they_do_not_overlap() {
        let n = 256;
        let h = Heatmap {
            title: "many".into(),
            subtitle: String::new(),
            unit: "ns".into(),
            labels: (0..n).map(|i| format!("cpu {i}")).collect(),
            groups: Vec::new(),
            supergroups: Vec::new(),
            values: (0..n * n).map(|i| Some((i % 97) as f64)).collect(),
        };
        let svg = h.render().unwrap();
        let rows: Vec<f64> = svg
            .lines()
            .filter(|l| l.starts_with("<text ") && l.contains(r#"text-anchor="end" dominant"#))
            .map(|l| {
                let y = l.split(r#" y=""#).nth(1).unwrap();
                y[..y.find('"').unwrap()].parse().unwrap()
            })
            .collect();
        assert_eq!(rows.len(), n / 2);
        let size = 5.0;
        assert!(rows.windows(2).all(|w| w[1] - w[0] >= size), "{rows:?}");
        assert!(svg.contains(">cpu 254</text>") && !svg.contains(">cpu 255</text>"));
        // Every cell still names its row and column.
        assert!(svg.contains("<title>cpu 255 / cpu 3: "));
        // 16 rows: every label.
        assert_eq!(Heatmap::label_every(Heatmap::cell(16), 12.0), 1);
    }
}
