//! The verbs objects (libibverbs' model): devices, contexts, protection domains, memory
//! regions and windows, completion queues, queue pairs, shared receive queues, address
//! handles and asynchronous events, with every check the API makes. They reach the wire
//! through the device's provider ([`crate::provider`]).

pub(crate) mod ah;
pub(crate) mod context;
pub(crate) mod copy;
pub(crate) mod cq;
pub(crate) mod datapath;
pub(crate) mod device;
pub(crate) mod env;
pub(crate) mod event;
pub(crate) mod hold;
pub mod mem;
pub(crate) mod mr;
pub(crate) mod mw;
pub(crate) mod pd;
pub(crate) mod qp;
pub(crate) mod records;
pub(crate) mod requests;
pub(crate) mod resources;
pub(crate) mod srq;
pub(crate) mod wr;
