//! What the pod asked for: `--target-domain-roles` and `--token-type`, parsed the way
//! k8s-athenz-sia reads them (`TARGET_DOMAIN_ROLES`, `TOKEN_TYPE`).

use athenz_core::names;

/// Most targets one pod may name: each costs a role certificate and tokens on every refresh.
pub const MAX_TARGETS: usize = 64;

/// One `<domain>:role.<role>` target.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomainRole {
    /// The role's domain.
    pub domain: String,
    /// The role's name within it.
    pub role: String,
}

impl DomainRole {
    /// Parses `<domain>:role.<role>`, both names validated.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (domain, role) =
            names::parse_domain_role("target", text).map_err(|e| format!("{text:?}: {e}"))?;
        Ok(Self {
            domain: domain.to_owned(),
            role: role.to_owned(),
        })
    }

    /// `<domain>:role.<role>`: the target as Athenz writes it, the stem of its file names and the
    /// access-token scope that asks for exactly this role.
    pub fn name(&self) -> String {
        format!("{}:role.{}", self.domain, self.role)
    }
}

/// Parses a comma-separated target list; blanks are skipped, repeats kept once, order kept.
pub fn parse_targets(text: &str) -> Result<Vec<DomainRole>, String> {
    let mut targets: Vec<DomainRole> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let target = DomainRole::parse(item)?;
        if !targets.contains(&target) {
            targets.push(target);
        }
    }
    if targets.len() > MAX_TARGETS {
        return Err(format!(
            "{} targets named; at most {MAX_TARGETS} are served",
            targets.len()
        ));
    }
    Ok(targets)
}

/// Which tokens are fetched for the targets and served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenTypes {
    /// OAuth2 access tokens (JWT).
    pub access: bool,
    /// Role tokens (`Z1`).
    pub role: bool,
}

impl TokenTypes {
    /// Parses k8s-athenz-sia's values: `accesstoken`, `roletoken`, `roletoken+accesstoken` (and
    /// the same two in the other order).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut types = Self {
            access: false,
            role: false,
        };
        for part in text.split('+') {
            match part.trim() {
                "accesstoken" if !types.access => types.access = true,
                "roletoken" if !types.role => types.role = true,
                _ => {
                    return Err(format!(
                        "{text:?}: must be accesstoken, roletoken or roletoken+accesstoken"
                    ));
                }
            }
        }
        Ok(types)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn targets_parse_as_k8s_athenz_sia_writes_them() {
        let targets = parse_targets(
            " media.sports:role.readers,, sys.auth:role.admin ,media.sports:role.readers",
        )
        .unwrap();
        assert_eq!(
            targets.iter().map(DomainRole::name).collect::<Vec<_>>(),
            ["media.sports:role.readers", "sys.auth:role.admin"]
        );
        assert!(parse_targets("").unwrap().is_empty());
    }

    #[test]
    fn malformed_and_hostile_targets_are_refused_naming_them() {
        for bad in [
            "media.sports",
            "media.sports:readers",
            ":role.readers",
            "media.sports:role.",
            "media/sports:role.readers",
            "media.sports:role.../x",
            "media.sports:role.a b",
            "media.sports:role.r\tx",
        ] {
            let err = parse_targets(bad).unwrap_err();
            assert!(err.contains(&format!("{:?}", bad.trim())), "{bad:?}: {err}");
        }
        let many: Vec<String> = (0..=MAX_TARGETS).map(|i| format!("d:role.r{i}")).collect();
        assert!(
            parse_targets(&many.join(","))
                .unwrap_err()
                .contains("at most")
        );
    }

    #[test]
    fn token_types_are_k8s_athenz_sia_values() {
        let both = TokenTypes {
            access: true,
            role: true,
        };
        assert_eq!(TokenTypes::parse("roletoken+accesstoken").unwrap(), both);
        assert_eq!(TokenTypes::parse("accesstoken+roletoken").unwrap(), both);
        assert_eq!(
            TokenTypes::parse("accesstoken").unwrap(),
            TokenTypes {
                access: true,
                role: false
            }
        );
        for bad in [
            "",
            "jwt",
            "accesstoken+accesstoken",
            "roletoken+",
            "ACCESSTOKEN",
        ] {
            assert!(TokenTypes::parse(bad).is_err(), "{bad:?}");
        }
    }
}
