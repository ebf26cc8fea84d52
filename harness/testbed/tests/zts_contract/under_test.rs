//! Which ZTS a bed's rows go to: the dev ZTS, or Athenz's own ZTS built from its source
//! (`athenz_testbed::real_zts`), both set up from the same settings and answering at a URL
//! whose certificates chain to a root the bed trusts.

use athenz_testbed::pki::CertAuthority;
use athenz_testbed::real_zts::{RealZts, RealZtsConfig, default_home};
use athenz_testbed::zts::{DevZts, DevZtsConfig};

pub(super) enum ZtsUnderTest {
    Dev(DevZts),
    Real {
        zts: Box<RealZts>,
        /// The CA real ZTS signs with; the bed mints client identities from it too.
        signer: CertAuthority,
        _work: tempfile::TempDir,
    },
}

impl ZtsUnderTest {
    /// Athenz's ZTS with `settings`, signing with `signer`; its files in a temporary directory
    /// under `$ATHENZ_ZTS_WORK` when set (kept there for reading its log), else under /tmp.
    pub(super) async fn start_real(settings: &DevZtsConfig, signer: CertAuthority) -> Self {
        let work = match std::env::var_os("ATHENZ_ZTS_WORK") {
            Some(parent) => {
                std::fs::create_dir_all(&parent).unwrap();
                tempfile::Builder::new()
                    .disable_cleanup(true)
                    .tempdir_in(parent)
                    .unwrap()
            }
            None => tempfile::tempdir().unwrap(),
        };
        let zts = RealZts::start(RealZtsConfig {
            home: default_home(),
            work: work.path().join("zts"),
            settings,
            signer: &signer,
        })
        .await
        .unwrap_or_else(|e| panic!("real ZTS did not start: {e}"));
        Self::Real {
            zts: Box::new(zts),
            signer,
            _work: work,
        }
    }

    pub(super) fn url(&self) -> &str {
        match self {
            Self::Dev(zts) => zts.url(),
            Self::Real { zts, .. } => zts.url(),
        }
    }

    pub(super) fn root_pem(&self) -> &str {
        match self {
            Self::Dev(zts) => zts.root_pem(),
            Self::Real { zts, .. } => zts.root_pem(),
        }
    }

    /// The CA whose certificates this ZTS accepts as its own.
    pub(super) fn ca(&self) -> &CertAuthority {
        match self {
            Self::Dev(zts) => zts.ca(),
            Self::Real { signer, .. } => signer,
        }
    }
}
