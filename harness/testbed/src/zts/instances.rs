//! Per-instance certificate records, as ZTS keeps them: the serial of the current certificate and
//! of the one before it. A refresh must present one of the two; any other serial means a copied or
//! stale certificate, and the instance is revoked (every later refresh is refused).

use std::collections::HashMap;
use std::sync::Mutex;

/// Which instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstanceKey {
    /// Provider.
    pub provider: String,
    /// Domain.
    pub domain: String,
    /// Service.
    pub service: String,
    /// Instance id.
    pub instance_id: String,
}

/// What ZTS remembers of an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRecord {
    /// Serial of the newest certificate (lowercase hex).
    pub current_serial: String,
    /// Serial of the certificate before it.
    pub previous_serial: Option<String>,
    /// Whether a stale serial was presented.
    pub revoked: bool,
}

/// Why a refresh is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefreshRefusal {
    /// ZTS never issued for this instance.
    Unknown,
    /// Revoked now or earlier.
    Revoked,
}

/// Records of every instance.
#[derive(Debug, Default)]
pub struct InstanceStore {
    records: Mutex<HashMap<InstanceKey, InstanceRecord>>,
}

impl InstanceStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<InstanceKey, InstanceRecord>> {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a (re-)registration: a fresh record with `serial` current.
    pub fn register(&self, key: InstanceKey, serial: &str) {
        self.lock().insert(
            key,
            InstanceRecord {
                current_serial: serial.to_owned(),
                previous_serial: None,
                revoked: false,
            },
        );
    }

    /// Checks the serial a refresh presents; a serial that is neither current nor previous revokes
    /// the instance.
    pub fn check_refresh(&self, key: &InstanceKey, presented: &str) -> Result<(), RefreshRefusal> {
        let mut records = self.lock();
        let record = records.get_mut(key).ok_or(RefreshRefusal::Unknown)?;
        if record.revoked {
            return Err(RefreshRefusal::Revoked);
        }
        if record.current_serial == presented
            || record.previous_serial.as_deref() == Some(presented)
        {
            return Ok(());
        }
        record.revoked = true;
        Err(RefreshRefusal::Revoked)
    }

    /// Records a refresh: the presented certificate becomes the previous one, the new one current.
    pub fn rotate(&self, key: &InstanceKey, presented: &str, new_serial: &str) {
        if let Some(record) = self.lock().get_mut(key) {
            record.previous_serial = Some(presented.to_owned());
            record.current_serial = new_serial.to_owned();
        }
    }

    /// The record of an instance.
    pub fn get(&self, key: &InstanceKey) -> Option<InstanceRecord> {
        self.lock().get(key).cloned()
    }

    /// Number of instances known.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no instance is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> InstanceKey {
        InstanceKey {
            provider: "p.q".into(),
            domain: "d".into(),
            service: "s".into(),
            instance_id: "i".into(),
        }
    }

    #[test]
    fn current_and_previous_serials_refresh_others_revoke() {
        let store = InstanceStore::default();
        assert_eq!(
            store.check_refresh(&key(), "a"),
            Err(RefreshRefusal::Unknown)
        );
        store.register(key(), "a");
        store.check_refresh(&key(), "a").unwrap();
        store.rotate(&key(), "a", "b");
        // the previous certificate may still refresh (its answer may have been lost)
        store.check_refresh(&key(), "a").unwrap();
        store.check_refresh(&key(), "b").unwrap();
        store.rotate(&key(), "b", "c");
        assert_eq!(
            store.check_refresh(&key(), "a"),
            Err(RefreshRefusal::Revoked)
        );
        // once revoked, even the current certificate is refused
        assert_eq!(
            store.check_refresh(&key(), "c"),
            Err(RefreshRefusal::Revoked)
        );
        // a new registration starts over
        store.register(key(), "d");
        store.check_refresh(&key(), "d").unwrap();
        assert_eq!(store.len(), 1);
    }
}
