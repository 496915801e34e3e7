//! Timestamps and durations as every surface prints and parses them.
//!
//! Timestamps are written as RFC 3339 UTC with milliseconds (`2026-11-21T08:15:02.123Z`),
//! which sort as strings, so the store keeps them as TEXT on both SQLite and PostgreSQL; they
//! are read with any offset (`Z`, `±HH:MM`) and fraction. Durations accept `500ms`, `30s` (or
//! plain `30`), `5m`, `24h`, `7d`, `2w`; where a point in time is asked for, a duration means
//! that long ago (`parse_time_or_ago`). The calendar (which days exist, leap years, offsets,
//! Unix time) is the `time` crate's `OffsetDateTime`, already compiled in for certificates:
//! a day that does not exist (`2026-02-31`) is refused, never rolled over. This module only
//! reads and writes the one text shape, digits in place, without the crate's
//! format-description machinery (this runs for every event and audit row; issue 21).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time, UtcOffset};

/// Milliseconds since the Unix epoch, now.
pub fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The current time as RFC 3339 UTC with milliseconds.
pub fn now_rfc3339() -> String {
    format_rfc3339(now_millis())
}

/// Formats Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ` (years 0000 to 9999; a time
/// outside them is written as the nearest end of that range).
pub fn format_rfc3339(millis: i64) -> String {
    let at = OffsetDateTime::from_unix_timestamp(millis.div_euclid(1000))
        .ok()
        .filter(|at| (0..=9999).contains(&at.year()));
    let (at, ms) = match at {
        Some(at) => (at, millis.rem_euclid(1000)),
        None if millis < 0 => (
            Date::from_calendar_date(0, Month::January, 1)
                .expect("a valid date")
                .midnight()
                .assume_utc(),
            0,
        ),
        None => (
            Date::from_calendar_date(9999, Month::December, 31)
                .and_then(|date| date.with_hms(23, 59, 59))
                .expect("a valid time")
                .assume_utc(),
            999,
        ),
    };
    // Digits written in place: this runs for every event and audit row, and `format!` costs
    // several times more (issue 21).
    let mut text = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut value: i64| {
        for i in (0..width).rev() {
            text[at + i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, 4, i64::from(at.year()));
    put(5, 2, i64::from(u8::from(at.month())));
    put(8, 2, i64::from(at.day()));
    put(11, 2, i64::from(at.hour()));
    put(14, 2, i64::from(at.minute()));
    put(17, 2, i64::from(at.second()));
    put(20, 3, ms);
    String::from_utf8(text.to_vec()).expect("digits are ASCII")
}

/// Parses RFC 3339 (`Z` or `±HH:MM` offsets, optional fraction) into Unix milliseconds.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    if bytes.len() < 20 || bytes[4] != b'-' || bytes[7] != b'-' || bytes[13] != b':' {
        return None;
    }
    if !matches!(bytes[10], b'T' | b't' | b' ') || bytes[16] != b':' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        if !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<3}", &fraction[..digits.min(3)]);
        millis = padded.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset = match rest {
        "Z" | "z" => UtcOffset::UTC,
        _ if rest.len() == 6 && (rest.starts_with('+') || rest.starts_with('-')) => {
            // `±HH:MM`, the last six bytes of `text`.
            let end = text.len();
            if rest.as_bytes()[3] != b':' {
                return None;
            }
            let hours = i8::try_from(number(end - 5..end - 3)?).ok()?;
            let minutes = i8::try_from(number(end - 2..end)?).ok()?;
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            UtcOffset::from_hms(sign * hours, sign * minutes, 0).ok()?
        }
        _ => return None,
    };
    // The calendar decides which days exist: 2026-02-31 is refused, not read as March 3rd.
    let small = |value: i64| u8::try_from(value).ok();
    let date = Date::from_calendar_date(
        i32::try_from(year).ok()?,
        Month::try_from(small(month)?).ok()?,
        small(day)?,
    )
    .ok()?;
    // A leap second (:60) reads as the first second of the next minute.
    let leap = i64::from(second == 60);
    let time = Time::from_hms(small(hour)?, small(minute)?, small(second - leap)?).ok()?;
    let at = PrimitiveDateTime::new(date, time).assume_offset(offset);
    Some((at.unix_timestamp() + leap) * 1000 + millis)
}

/// Parses `500ms`, `30s`, `5m`, `24h`, `7d`, `2w` (and plain seconds, `30`).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let value: u64 = digits.parse().ok()?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 7 * 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(value.checked_mul(millis_per_unit)?))
}

/// Formats a duration in the largest unit that divides it (`30s`, `5m`, `1500ms`).
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis() as u64;
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= size && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// A point in time given as RFC 3339 or as a duration before now (`24h` = a day ago). A
/// duration longer than the clock can count back reads as the earliest point it can.
pub fn parse_time_or_ago(text: &str) -> Option<i64> {
    parse_rfc3339(text).or_else(|| {
        let ago = i64::try_from(parse_duration(text)?.as_millis()).unwrap_or(i64::MAX);
        Some(now_millis().saturating_sub(ago))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_beyond_the_clock_reads_as_its_start() {
        for text in [
            "18446744073709551615ms",
            "9223372036854775808ms",
            "30500568904w",
        ] {
            let at = parse_time_or_ago(text).unwrap();
            assert!(at < -9_000_000_000_000_000_000, "{text}: {at}");
        }
        let hour_ago = parse_time_or_ago("1h").unwrap();
        assert!((now_millis() - hour_ago - 3_600_000).abs() < 60_000);
    }

    #[test]
    fn rfc3339_round_trip() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (1_795_248_902_123, "2026-11-21T08:15:02.123Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
        ];
        for (millis, text) in cases {
            assert_eq!(format_rfc3339(millis), text);
            assert_eq!(parse_rfc3339(text), Some(millis), "{text}");
        }
    }

    /// Every kind of date in range reads back as written; the ends of the range hold.
    #[test]
    fn rfc3339_round_trips_across_the_calendar() {
        let mut millis: i64 = -62_167_219_200_000; // 0000-01-01
        while millis < 253_402_300_800_000 {
            let text = format_rfc3339(millis);
            assert_eq!(parse_rfc3339(&text), Some(millis), "{text}");
            millis += 7_919_999_937;
        }
        assert_eq!(format_rfc3339(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(
            format_rfc3339(253_402_300_800_000),
            "9999-12-31T23:59:59.999Z"
        );
        assert_eq!(
            format_rfc3339(-62_167_219_200_001),
            "0000-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn rfc3339_offsets_and_garbage() {
        assert_eq!(
            parse_rfc3339("2026-11-21T09:15:02+01:00"),
            parse_rfc3339("2026-11-21T08:15:02Z")
        );
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-02-31T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2100-02-29T00:00:00Z",
            "2026-11-21T24:00:00Z",
            "2026-11-21T08:60:00Z",
            "2026-11-21T08:15:61Z",
            "2026-11-21T08:15:02",
            "2026-11-21T08:15:02.Z",
            "2026-11-21T08:15:02+01:60",
            "2026-11-21T08:15:02+-1:00",
            "2026-11-21T08:15:02+01-00",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
            // Nor is it read as a duration ago: where a user gives a time, it is refused.
            assert_eq!(parse_time_or_ago(bad), None, "{bad}");
        }
        let same = [
            ("2024-02-29T12:00:00-05:30", "2024-02-29T17:30:00Z"),
            ("2016-12-31T23:59:60Z", "2017-01-01T00:00:00Z"),
            ("2026-11-21t08:15:02.1234z", "2026-11-21T08:15:02.123Z"),
            ("2026-11-21 08:15:02.5Z", "2026-11-21T08:15:02.500Z"),
        ];
        for (text, utc) in same {
            assert_eq!(parse_rfc3339(text), parse_rfc3339(utc), "{text}");
            assert!(parse_rfc3339(text).is_some(), "{text}");
        }
    }

    #[test]
    fn durations() {
        let cases = [
            ("500ms", Some(500)),
            ("30s", Some(30_000)),
            ("5m", Some(300_000)),
            ("24h", Some(86_400_000)),
            ("7d", Some(604_800_000)),
            ("30", Some(30_000)),
            ("5x", None),
            ("", None),
            ("-5s", None),
        ];
        for (text, expected) in cases {
            assert_eq!(
                parse_duration(text).map(|d| d.as_millis() as u64),
                expected,
                "{text}"
            );
        }
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }
}
