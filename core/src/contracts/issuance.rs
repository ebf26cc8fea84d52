//! One issuance of a pod's identity, as the agent's identity manager and the CSI driver both
//! speak of it: which registration of the pod's instance it is, and what it gave.

use crate::agent_api::IdentityResponse;
use crate::crypto::CertInfo;

/// Which registration of a pod's instance an issuance is: the one fact every door into the
/// agent (socket init, CSI publish, rotation, early issuance) needs to know about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// The pod's first: it may not be in the kubelet's pod list yet (a pod being started
    /// reaches the list after its volumes are mounted).
    First,
    /// Again, after a refused refresh or a lost set: the pod had an identity, so it was listed;
    /// a list made after the question that lacks it says it is gone.
    Again,
}

/// An identity as it was issued: the answer a pod or its files get, and its leaf certificate
/// as read to check it (so it is not parsed again).
#[derive(Debug, Clone)]
pub struct Issued {
    /// The credentials.
    pub answer: IdentityResponse,
    /// The leaf certificate of `answer.cert_pem`.
    pub cert: CertInfo,
}
