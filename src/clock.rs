//! Timestamps and durations as every surface prints and parses them.
//!
//! Timestamps are written as RFC 3339 UTC with milliseconds (`2026-11-21T08:15:02.123Z`),
//! which sort as strings, so the store keeps them as TEXT on both SQLite and PostgreSQL; they
//! are read with any offset (`Z`, `±HH:MM`) and fraction. Durations accept `500ms`, `30s` (or
//! plain `30`), `5m`, `24h`, `7d`, `2w`; where a point in time is asked for, a duration means
//! that long ago (`parse_time_or_ago`). The calendar (days in a month, leap years, day
//! numbers) is the `time` crate's, already compiled in for certificates; this module reads
//! and writes the text itself, without the crate's format-description machinery.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::{Date, Month};

/// Julian day number of 1970-01-01: `time` counts days from the Julian epoch.
const UNIX_EPOCH_JULIAN_DAY: i64 = 2_440_588;

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
    let seconds = millis.div_euclid(1000);
    let ms = millis.rem_euclid(1000);
    let days = seconds.div_euclid(86_400);
    let rem = seconds.rem_euclid(86_400);
    let date = i32::try_from(days + UNIX_EPOCH_JULIAN_DAY)
        .ok()
        .and_then(|day| Date::from_julian_day(day).ok())
        .filter(|date| (0..=9999).contains(&date.year()));
    let (date, rem, ms) = match date {
        Some(date) => (date, rem, ms),
        None if days < 0 => (
            Date::from_calendar_date(0, Month::January, 1).expect("valid"),
            0,
            0,
        ),
        None => (
            Date::from_calendar_date(9999, Month::December, 31).expect("valid"),
            86_399,
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
    put(0, 4, i64::from(date.year()));
    put(5, 2, i64::from(u8::from(date.month())));
    put(8, 2, i64::from(date.day()));
    put(11, 2, rem / 3600);
    put(14, 2, rem % 3600 / 60);
    put(17, 2, rem % 60);
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
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
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
    let offset_seconds = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && (rest.starts_with('+') || rest.starts_with('-')) => {
            let hours: i64 = rest.get(1..3)?.parse().ok()?;
            let minutes: i64 = rest.get(4..6)?.parse().ok()?;
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            sign * (hours * 3600 + minutes * 60)
        }
        _ => return None,
    };
    // The calendar decides which days exist: 2026-02-31 is refused, not read as March 3rd.
    let month = Month::try_from(u8::try_from(month).ok()?).ok()?;
    let date =
        Date::from_calendar_date(i32::try_from(year).ok()?, month, u8::try_from(day).ok()?).ok()?;
    let days = i64::from(date.to_julian_day()) - UNIX_EPOCH_JULIAN_DAY;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_seconds;
    Some(seconds * 1000 + millis)
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

/// A point in time given as RFC 3339 or as a duration before now (`24h` = a day ago).
pub fn parse_time_or_ago(text: &str) -> Option<i64> {
    parse_rfc3339(text)
        .or_else(|| parse_duration(text).map(|ago| now_millis() - ago.as_millis() as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "2026-11-21T08:15:02",
            "2026-11-21T08:15:02.Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
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
