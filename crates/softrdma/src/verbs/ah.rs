//! Address handles (`ibv_create_ah`, `ibv_destroy_ah`) and the address vector they share with
//! connected QPs (`struct ibv_ah_attr`).

use crate::error::{DestroyError, Error, Result};
use crate::gid::Gid;
use crate::verbs::device::{Device, GID_TABLE_LEN, PORT_NUM};
use crate::verbs::hold::Hold;
use crate::verbs::pd::{Pd, PdInner};
use crate::verbs::resources::{CountGuard, Kind, Resources};
use std::net::IpAddr;
use std::sync::Arc;

/// `struct ibv_global_route`: the GRH fields of an address vector. On RoCEv2 they become the
/// IP header: `dgid` the destination address, `traffic_class` the TOS byte, `hop_limit` the
/// TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GlobalRoute {
    /// The destination GID (IPv4-mapped or IPv6 address).
    pub dgid: Gid,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// Index of the source GID in the local table (0).
    pub sgid_index: u8,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// Traffic class / TOS.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`: how to reach a peer port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhAttr {
    /// The global route (mandatory on RoCE: `is_global` must be set).
    pub grh: GlobalRoute,
    /// Destination LID (ignored on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits (ignored on RoCE).
    pub src_path_bits: u8,
    /// Static rate (`enum ibv_rate`; accepted, not enforced).
    pub static_rate: u8,
    /// Whether `grh` is valid. RoCE ports require it ([`crate::QPF_GRH_REQUIRED`]).
    pub is_global: bool,
    /// The local port (1).
    pub port_num: u8,
}

impl AhAttr {
    /// An address vector for the peer at `ip`, with the defaults rdma_cm uses on RoCE
    /// (hop limit 64).
    pub fn for_ip(ip: IpAddr) -> AhAttr {
        AhAttr {
            grh: GlobalRoute {
                dgid: Gid::from_ip(ip),
                hop_limit: 64,
                ..Default::default()
            },
            is_global: true,
            port_num: PORT_NUM,
            ..Default::default()
        }
    }

    /// Checks the address vector for use on `dev`: GRH present, port 1, a source GID index
    /// inside the table, a non-zero destination GID of the device's address family, and a
    /// 20-bit flow label. Every failure is `EINVAL`.
    pub(crate) fn validate(&self, dev: &Device) -> Result<()> {
        if !self.is_global {
            return Err(Error::invalid(
                "the address vector has no GRH; RoCE ports require is_global",
            ));
        }
        if self.port_num != PORT_NUM {
            return Err(Error::invalid(format!(
                "port {} does not exist (the only port is 1)",
                self.port_num
            )));
        }
        if u32::from(self.grh.sgid_index) >= GID_TABLE_LEN {
            return Err(Error::invalid(format!(
                "sgid_index {} is outside the GID table of {GID_TABLE_LEN} entries",
                self.grh.sgid_index
            )));
        }
        if self.grh.dgid.is_zero() {
            return Err(Error::invalid("the destination GID is zero"));
        }
        if self.grh.flow_label > 0xf_ffff {
            return Err(Error::invalid("the flow label is wider than 20 bits"));
        }
        let dst = self.grh.dgid.to_ip();
        if dst.is_ipv4() != dev.addr().is_ipv4() {
            return Err(Error::invalid(format!(
                "{} cannot be reached from the {} device {}",
                dst,
                if dev.addr().is_ipv4() { "IPv4" } else { "IPv6" },
                dev.addr()
            )));
        }
        Ok(())
    }
}

/// An address handle (`struct ibv_ah`): a checked address vector for UD sends.
pub struct Ah {
    pub(crate) inner: Arc<AhInner>,
}

pub(crate) struct AhInner {
    pub(crate) pd: Hold<PdInner>,
    pub(crate) attr: AhAttr,
    _count: CountGuard,
}

impl Pd {
    /// Creates an address handle (`ibv_create_ah`).
    ///
    /// Fails with `EINVAL` when the address vector is not usable on this device (see
    /// [`AhAttr`]: GRH required, port 1, GID index, address family) and `ENOMEM` past
    /// `max_ah`.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah> {
        attr.validate(self.device())?;
        let count = Resources::acquire(self.inner.shared(), Kind::Ah)?;
        Ok(Ah {
            inner: Arc::new(AhInner {
                pd: Hold::new(&self.inner),
                attr: *attr,
                _count: count,
            }),
        })
    }
}

impl Ah {
    /// The address vector the handle was created with.
    pub fn attr(&self) -> &AhAttr {
        &self.inner.attr
    }

    /// Destroys the handle (`ibv_destroy_ah`). Sends already posted with it keep their own
    /// reference and complete normally. Never fails on softrdma.
    pub fn destroy(self) -> std::result::Result<(), DestroyError<Ah>> {
        Ok(())
    }
}

impl std::fmt::Debug for AhInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AhInner").field("attr", &self.attr).finish()
    }
}

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ah")
            .field("attr", &self.inner.attr)
            .finish()
    }
}

impl crate::Context {
    /// The address vector that answers a received UD message (`ibv_init_ah_from_wc`): the
    /// destination is the source address found in the 40-byte GRH area at the start of the
    /// receive buffer (the IPv4 header in its last 20 bytes, or the IPv6 header), with the
    /// hop limit and traffic class of a fresh route.
    ///
    /// Fails with `EINVAL` when `port_num` is not 1, the completion has no GRH
    /// (`IBV_WC_GRH` unset) or the GRH area holds neither an IPv4 nor an IPv6 header.
    pub fn init_ah_from_wc(
        &self,
        port_num: u8,
        wc: &crate::WorkCompletion,
        grh: &[u8; 40],
    ) -> Result<AhAttr> {
        if port_num != PORT_NUM {
            return Err(Error::invalid(format!("port {port_num} does not exist")));
        }
        if !wc.wc_flags.contains(crate::WcFlags::GRH) {
            return Err(Error::invalid("the work completion has no GRH"));
        }
        let src: IpAddr = if grh[20] >> 4 == 4 {
            let b: [u8; 4] = grh[32..36].try_into().expect("4 bytes");
            IpAddr::from(b)
        } else if grh[0] >> 4 == 6 {
            let b: [u8; 16] = grh[8..24].try_into().expect("16 bytes");
            let v6 = std::net::Ipv6Addr::from(b);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        } else {
            return Err(Error::invalid(
                "the GRH area holds neither an IPv4 nor an IPv6 header",
            ));
        };
        let attr = AhAttr {
            sl: wc.sl,
            ..AhAttr::for_ip(src)
        };
        attr.validate(self.device())?;
        Ok(attr)
    }
}

impl Pd {
    /// Creates the address handle that answers a received UD message
    /// (`ibv_create_ah_from_wc`); see [`crate::Context::init_ah_from_wc`].
    ///
    /// Fails like `init_ah_from_wc` and [`Pd::create_ah`].
    pub fn create_ah_from_wc(
        &self,
        port_num: u8,
        wc: &crate::WorkCompletion,
        grh: &[u8; 40],
    ) -> Result<Ah> {
        let ctx = crate::Context {
            inner: self.inner.ctx.arc().clone(),
        };
        let attr = ctx.init_ah_from_wc(port_num, wc, grh)?;
        self.create_ah(&attr)
    }
}
