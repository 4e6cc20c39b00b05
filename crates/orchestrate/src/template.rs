//! Partition templates: the time-dependent part of a dataset's path.
//!
//! `dt={date}/hour={hour}` names one directory per hour; `{date}` alone one per day. The
//! placeholders are `{date}` (`%Y%m%d`), `{hour}` (`%H`) and `{time:FMT}` with any chrono
//! `strftime` format (`{time:%Y-%m-%d}`). Times are UTC. The granularity (hourly or daily)
//! follows from the template itself: hourly when two hours of one day render differently.

use chrono::format::{Item, StrftimeItems};
use chrono::{Duration, NaiveDate, NaiveDateTime};

/// How long one partition covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Granularity {
    /// One partition per UTC hour.
    Hour,
    /// One partition per UTC day.
    Day,
}

impl Granularity {
    /// The length of one partition.
    pub fn step(self) -> Duration {
        match self {
            Granularity::Hour => Duration::hours(1),
            Granularity::Day => Duration::days(1),
        }
    }

    /// The start of the partition holding `t`.
    pub fn floor(self, t: NaiveDateTime) -> NaiveDateTime {
        let day = t.date().and_hms_opt(0, 0, 0).expect("midnight exists");
        match self {
            Granularity::Day => day,
            Granularity::Hour => day + Duration::hours(i64::from(chrono::Timelike::hour(&t))),
        }
    }

    /// `"hour"` or `"day"`, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Granularity::Hour => "hour",
            Granularity::Day => "day",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Time(String),
}

/// A compiled partition template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionTemplate {
    text: String,
    pieces: Vec<Piece>,
    granularity: Granularity,
}

impl PartitionTemplate {
    /// Compiles `text`. The error says what is wrong with it, for a message that names the
    /// dataset and field.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(['{', '}']) {
            if rest.as_bytes()[open] == b'}' {
                return Err(format!("unmatched `}}` in `{text}`"));
            }
            if open > 0 {
                pieces.push(Piece::Literal(rest[..open].to_string()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("unclosed `{{` in `{text}`"))?
                + open;
            let name = &rest[open + 1..close];
            let format = match name {
                "date" => "%Y%m%d".to_string(),
                "hour" => "%H".to_string(),
                _ => match name.strip_prefix("time:") {
                    Some(f) if !f.is_empty() => {
                        if StrftimeItems::new(f).any(|i| matches!(i, Item::Error)) {
                            return Err(format!("`{{{name}}}`: `{f}` is not a strftime format"));
                        }
                        f.to_string()
                    }
                    _ => {
                        return Err(format!(
                        "unknown placeholder `{{{name}}}` (use {{date}}, {{hour}} or {{time:FMT}})"
                    ))
                    }
                },
            };
            pieces.push(Piece::Time(format));
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Literal(rest.to_string()));
        }
        if !pieces.iter().any(|p| matches!(p, Piece::Time(_))) {
            return Err(format!(
                "`{text}` has no time placeholder: name the partition with {{date}} (and {{hour}})"
            ));
        }
        let mut template = Self {
            text: text.to_string(),
            pieces,
            granularity: Granularity::Day,
        };
        let day = NaiveDate::from_ymd_opt(2001, 2, 3).expect("valid date");
        let at = |d: NaiveDate, h: u32| d.and_hms_opt(h, 0, 0).expect("valid hour");
        if template.render(at(day, 0)) != template.render(at(day, 13)) {
            template.granularity = Granularity::Hour;
        }
        // A partition must name its day, month and year, or two partitions share a path.
        for other in [
            day + Duration::days(1),
            NaiveDate::from_ymd_opt(2001, 3, 3).expect("valid date"),
            NaiveDate::from_ymd_opt(2002, 2, 3).expect("valid date"),
        ] {
            if template.render(at(day, 0)) == template.render(at(other, 0)) {
                return Err(format!(
                    "`{text}` does not name the full date (year, month and day): {day} and {other} would share a partition"
                ));
            }
        }
        Ok(template)
    }

    /// The path of the partition starting at `t` (relative to the dataset's root).
    pub fn render(&self, t: NaiveDateTime) -> String {
        let mut out = String::with_capacity(self.text.len() + 8);
        for p in &self.pieces {
            match p {
                Piece::Literal(s) => out.push_str(s),
                Piece::Time(f) => {
                    use std::fmt::Write;
                    write!(out, "{}", t.format(f)).expect("a checked format renders");
                }
            }
        }
        out
    }

    /// One partition per hour or per day.
    pub fn granularity(&self) -> Granularity {
        self.granularity
    }

    /// The template as written.
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(y: i32, m: u32, d: u32, h: u32) -> NaiveDateTime {
        NaiveDate::from_ymd_opt(y, m, d)
            .unwrap()
            .and_hms_opt(h, 0, 0)
            .unwrap()
    }

    #[test]
    fn hive_style_hourly_partitions_render_and_are_hourly() {
        let p = PartitionTemplate::parse("dt={date}/hour={hour}").unwrap();
        assert_eq!(p.granularity(), Granularity::Hour);
        assert_eq!(p.render(t(2026, 11, 3, 7)), "dt=20261103/hour=07");
    }

    #[test]
    fn a_strftime_template_without_hours_is_daily() {
        let p = PartitionTemplate::parse("day={time:%Y-%m-%d}").unwrap();
        assert_eq!(p.granularity(), Granularity::Day);
        assert_eq!(p.render(t(2026, 1, 9, 23)), "day=2026-01-09");
    }

    #[test]
    fn templates_that_cannot_name_a_partition_are_refused_with_the_reason() {
        for (text, says) in [
            ("plain/dir", "no time placeholder"),
            ("dt={day}", "unknown placeholder `{day}`"),
            ("dt={date", "unclosed"),
            ("dt=date}", "unmatched"),
            ("h={hour}", "full date"),
            ("m={time:%m-%d}", "full date"),
            ("x={time:%Q}", "not a strftime format"),
        ] {
            let e = PartitionTemplate::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn floor_rounds_down_to_the_partition_start() {
        let at = t(2026, 11, 3, 7) + Duration::minutes(42);
        assert_eq!(Granularity::Hour.floor(at), t(2026, 11, 3, 7));
        assert_eq!(Granularity::Day.floor(at), t(2026, 11, 3, 0));
    }
}
