//! Time windows of a dataset: which partitions a job trains on.
//!
//! A window is half-open, `[start, end)` over partition start times (UTC):
//! * `from` and `to`: a fixed range (`to` exclusive: `from = "2026-11-01", to = "2026-11-04"`
//!   is three days);
//! * `from` alone: from `from` up to now, growing as time passes;
//! * `last = "3d"`: the most recent three days before now, sliding with the clock (or with
//!   the job's fixed `now`).
//!
//! A partition is in the window only once its whole period has passed (the partition of
//! the current hour is still being written), whatever `to` says.

use chrono::{Duration, NaiveDate, NaiveDateTime};

use crate::template::Granularity;

/// A window as the job file states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSpec {
    /// `from` (inclusive) to `to` (exclusive, `None`: now).
    Range {
        from: NaiveDateTime,
        to: Option<NaiveDateTime>,
    },
    /// The last `Duration` before now.
    Last(Duration),
}

/// The partition start times `[start, end)` of a window at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// First partition start in the window.
    pub start: NaiveDateTime,
    /// One past the last partition start (exclusive).
    pub end: NaiveDateTime,
}

impl Window {
    /// The partition start times of the window, oldest first.
    pub fn partitions(self, g: Granularity) -> impl Iterator<Item = NaiveDateTime> {
        let step = g.step();
        let mut t = g.floor(self.start);
        if t < self.start {
            t += step;
        }
        std::iter::from_fn(move || {
            (t < self.end).then(|| {
                let now = t;
                t += step;
                now
            })
        })
    }
}

impl WindowSpec {
    /// Builds a window from the optional `from`, `to` and `last` fields. The error names the
    /// field at fault and says what to write instead.
    pub fn parse(
        from: Option<&str>,
        to: Option<&str>,
        last: Option<&str>,
    ) -> Result<Self, (&'static str, String)> {
        match (from, to, last) {
            (None, None, None) => Err((
                "from",
                "no time window: set `from` (and `to`), or `last` (e.g. \"3d\")".into(),
            )),
            (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
                Err(("last", "set either `from`/`to` or `last`, not both".into()))
            }
            (None, Some(_), None) => Err((
                "to",
                "`to` needs a `from` (or use `last` for a sliding window)".into(),
            )),
            (None, None, Some(l)) => {
                let d = humantime::parse_duration(l).map_err(|e| {
                    (
                        "last",
                        format!("`{l}` is not a duration like \"3d\" or \"36h\": {e}"),
                    )
                })?;
                let d = Duration::from_std(d)
                    .ok()
                    .filter(|d| *d >= Duration::hours(1) && *d <= Duration::days(100 * 366))
                    .ok_or(("last", format!("`{l}` must be between 1h and 100 years")))?;
                Ok(WindowSpec::Last(d))
            }
            (Some(f), to, None) => {
                let from = parse_time(f).map_err(|e| ("from", e))?;
                let to = to.map(parse_time).transpose().map_err(|e| ("to", e))?;
                if let Some(to) = to {
                    if from >= to {
                        return Err((
                            "to",
                            format!(
                                "the window is empty: `from` ({from}) must be before `to` ({to}); `to` is exclusive"
                            ),
                        ));
                    }
                }
                Ok(WindowSpec::Range { from, to })
            }
        }
    }

    /// The window at `now` for partitions of granularity `g`: only partitions whose whole
    /// period lies before `now`.
    pub fn at(self, now: NaiveDateTime, g: Granularity) -> Window {
        let complete = g.floor(now);
        match self {
            WindowSpec::Range { from, to } => Window {
                start: from,
                end: to.map_or(complete, |t| t.min(complete)),
            },
            WindowSpec::Last(d) => Window {
                start: g.floor(complete - d),
                end: complete,
            },
        }
    }

    /// True when the window stops growing once `now` passes its end.
    pub fn is_bounded(self) -> bool {
        matches!(self, WindowSpec::Range { to: Some(_), .. })
    }

    /// True when, at `now`, the window has reached its final extent: it is bounded and
    /// every partition before its `to` has a whole period in the past.
    pub fn is_closed_at(self, now: NaiveDateTime, g: Granularity) -> bool {
        match self {
            WindowSpec::Range { to: Some(to), .. } => g.floor(now) >= to,
            _ => false,
        }
    }
}

/// The wall clock, in UTC.
pub fn now_utc() -> NaiveDateTime {
    chrono::Utc::now().naive_utc()
}

/// Parses a UTC time: `2026-11-03`, `2026-11-03T07`, `2026-11-03T07:30`,
/// `2026-11-03T07:30:00` (a space for the `T` and a trailing `Z` are accepted).
pub fn parse_time(text: &str) -> Result<NaiveDateTime, String> {
    let s = text.trim().trim_end_matches('Z').replace(' ', "T");
    if let Ok(d) = NaiveDate::parse_from_str(&s, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).expect("midnight exists"));
    }
    for f in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(&s, f) {
            return Ok(t);
        }
    }
    if let Some((day, hour)) = s.split_once('T') {
        if let (Ok(d), Ok(h)) = (
            NaiveDate::parse_from_str(day, "%Y-%m-%d"),
            hour.parse::<u32>(),
        ) {
            if let Some(t) = d.and_hms_opt(h, 0, 0) {
                return Ok(t);
            }
        }
    }
    Err(format!(
        "`{text}` is not a UTC time like \"2026-11-03\" or \"2026-11-03T07\""
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> NaiveDateTime {
        parse_time(s).unwrap()
    }

    #[test]
    fn times_parse_in_the_documented_forms() {
        assert_eq!(t("2026-11-03T07"), t("2026-11-03 07:00:00Z"));
        assert_eq!(t("2026-11-03T07:30"), t("2026-11-03T07:30:00"));
        assert_eq!(
            t("2026-11-03 07:30:00.5").to_string(),
            "2026-11-03 07:30:00.500"
        );
        assert!(parse_time("03.11.2026")
            .unwrap_err()
            .contains("not a UTC time"));
    }

    #[test]
    fn a_fixed_range_is_half_open_and_never_reaches_into_the_current_partition() {
        let w = WindowSpec::parse(Some("2026-11-01"), Some("2026-11-04"), None).unwrap();
        let now = t("2026-12-01");
        let days: Vec<_> = w
            .at(now, Granularity::Day)
            .partitions(Granularity::Day)
            .collect();
        assert_eq!(
            days,
            vec![t("2026-11-01"), t("2026-11-02"), t("2026-11-03")]
        );
        let hours = w
            .at(now, Granularity::Hour)
            .partitions(Granularity::Hour)
            .count();
        assert_eq!(hours, 72);
        // Before `to` has passed, only complete partitions are in the window.
        let early = w.at(t("2026-11-02T05:10"), Granularity::Hour);
        assert_eq!(early.partitions(Granularity::Hour).count(), 24 + 5);
    }

    #[test]
    fn last_slides_with_now() {
        let w = WindowSpec::parse(None, None, Some("3d")).unwrap();
        let at = w.at(t("2026-11-04T10:30"), Granularity::Hour);
        assert_eq!(at.start, t("2026-11-01T10"));
        assert_eq!(at.end, t("2026-11-04T10"));
        assert_eq!(at.partitions(Granularity::Hour).count(), 72);
        let days = w.at(t("2026-11-04T10:30"), Granularity::Day);
        assert_eq!(days.partitions(Granularity::Day).count(), 3);
    }

    #[test]
    fn a_partition_starting_before_from_is_not_in_the_window() {
        let w = WindowSpec::parse(Some("2026-11-01T12"), Some("2026-11-03"), None).unwrap();
        let days: Vec<_> = w
            .at(t("2026-12-01"), Granularity::Day)
            .partitions(Granularity::Day)
            .collect();
        assert_eq!(days, vec![t("2026-11-02")]);
    }

    #[test]
    fn bad_windows_name_the_field_and_the_fix() {
        type Case<'a> = (
            Option<&'a str>,
            Option<&'a str>,
            Option<&'a str>,
            &'a str,
            &'a str,
        );
        let cases: [Case; 6] = [
            (None, None, None, "from", "no time window"),
            (
                Some("2026-11-04"),
                Some("2026-11-01"),
                None,
                "to",
                "must be before",
            ),
            (Some("2026-11-04"), Some("2026-11-04"), None, "to", "empty"),
            (None, Some("2026-11-04"), None, "to", "needs a `from`"),
            (Some("2026-11-01"), None, Some("3d"), "last", "not both"),
            (None, None, Some("soon"), "last", "not a duration"),
        ];
        for (from, to, last, field, says) in cases {
            let (f, reason) = WindowSpec::parse(from, to, last).unwrap_err();
            assert_eq!(f, field, "{reason}");
            assert!(reason.contains(says), "{reason}");
        }
    }
}
