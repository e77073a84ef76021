//! The one bound on every duration a flag, a config file or a request may give, and
//! the human form durations are read in (`500ms`, `5m`, `48h`), for flags and files
//! alike.

use std::time::Duration;

/// The longest duration accepted anywhere: ten years. Larger values are typos, and they
/// overflow the date arithmetic of leases and deadlines (`now + delay + lease`), which
/// panics. A year is humantime's 365.25 days, so `10y` itself is accepted and the limit
/// prints as `10years`.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 31_557_600);

/// Why a human duration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    /// Not a duration humantime reads (`2s`, `5m`, `48h`).
    #[error(transparent)]
    Invalid(#[from] humantime::DurationError),
    /// Over [`MAX_DURATION`].
    #[error("{value} is over the limit of {}", humantime::format_duration(MAX_DURATION))]
    TooLong {
        /// The value as given.
        value: String,
    },
}

/// Parses a human duration (`500ms`, `5m`, `48h`) of at most [`MAX_DURATION`]. The
/// value parser of every duration flag: clap reports an `Err` naming the flag, exit 64.
pub fn parse_bounded_duration(value: &str) -> Result<Duration, DurationError> {
    let duration = humantime::parse_duration(value)?;
    if duration > MAX_DURATION {
        return Err(DurationError::TooLong { value: value.trim().to_owned() });
    }
    Ok(duration)
}

/// Serde for durations in configuration files: the human form of the flags (`500ms`,
/// `5m`, `48h`) through `humantime-serde`, bounded at [`MAX_DURATION`] like every flag.
/// Use as `#[serde(with = "crate::duration::human")]` (or `human::option`).
pub mod human {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    /// Writes `5m`, `1h 30m`.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        humantime_serde::serialize(d, s)
    }

    /// Reads a human duration of at most ten years.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        bounded(humantime_serde::deserialize(d)?)
    }

    fn bounded<E: serde::de::Error>(d: Duration) -> Result<Duration, E> {
        if d > super::MAX_DURATION {
            return Err(E::custom(format!(
                "duration {} is over the limit of {}",
                humantime::format_duration(d),
                humantime::format_duration(super::MAX_DURATION)
            )));
        }
        Ok(d)
    }

    /// The same for an optional duration.
    pub mod option {
        use std::time::Duration;

        use serde::{Deserializer, Serializer};

        /// Writes `5m`, or nothing.
        pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            humantime_serde::option::serialize(d, s)
        }

        /// Reads an optional human duration of at most ten years.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            humantime_serde::option::deserialize(d)?.map(super::bounded).transpose()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_up_to_ten_years_parse() {
        assert_eq!(parse_bounded_duration("48h").unwrap(), Duration::from_secs(48 * 3600));
        assert_eq!(parse_bounded_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_bounded_duration("10years").unwrap(), MAX_DURATION);
        assert_eq!(parse_bounded_duration("10y").unwrap(), MAX_DURATION);
        assert_eq!(humantime::format_duration(MAX_DURATION).to_string(), "10years");
    }

    #[test]
    fn longer_durations_are_refused_naming_value_and_limit() {
        for value in ["500000years", "10years 1s", "3653days", "87660h 1ns"] {
            let e = parse_bounded_duration(value).unwrap_err();
            assert!(matches!(e, DurationError::TooLong { .. }), "{value}: {e:?}");
            assert_eq!(e.to_string(), format!("{value} is over the limit of 10years"));
        }
    }

    #[test]
    fn config_durations_are_human_and_bounded() {
        #[derive(Debug, serde::Deserialize, serde::Serialize)]
        struct C {
            #[serde(with = "human")]
            d: Duration,
            #[serde(default, with = "human::option")]
            o: Option<Duration>,
        }
        let c: C = toml::from_str("d = \"90s\"\no = \"10years\"").unwrap();
        assert_eq!((c.d, c.o), (Duration::from_secs(90), Some(MAX_DURATION)));
        assert_eq!(toml::to_string(&c).unwrap(), "d = \"1m 30s\"\no = \"10years\"\n");
        let e = toml::from_str::<C>("d = \"500000years\"").unwrap_err().to_string();
        assert!(e.contains("d = ") && e.contains("over the limit of 10years"), "{e}");
        let e = toml::from_str::<C>("d = \"an hour\"").unwrap_err().to_string();
        assert!(e.contains("d = ") && e.contains("duration"), "{e}");
        assert!(toml::from_str::<C>("d = \"1s\"").unwrap().o.is_none());
    }

    #[test]
    fn malformed_durations_keep_humantimes_message() {
        let e = parse_bounded_duration("5 parsecs").unwrap_err();
        assert_eq!(e.to_string(), humantime::parse_duration("5 parsecs").unwrap_err().to_string());
        assert!(matches!(parse_bounded_duration("99999999999999999999years"), Err(DurationError::Invalid(_))));
    }
}
