//! The machine's cores as the orchestrator hands them out on a CPU host.
//!
//! On a CPU host an inference function's (IF's) share of the device is a set
//! of cores ([`crate::alloc::split_cores`] cuts consecutive runs out of one
//! ordered list). This module makes that list: the cores this process may
//! run on, in the order they should be given out, the ones NUMA-local to the
//! NIC first.
//!
//! # Where the cores come from
//!
//! - [`Topology::discover`] asks hwloc (the `hwlocality` crate, system hwloc
//!   2.9). The cores are the PUs (hardware threads) that are online, in
//!   hwloc's *allowed* cpuset (on Linux, the cgroup's cpuset) **and** in
//!   this process's CPU binding (`sched_getaffinity`, e.g. `taskset`), so the
//!   orchestrator never hands out a core it could not run on itself. hwloc
//!   also gives the NUMA nodes and, for each PCI device, the cores local to
//!   it.
//! - [`Topology::fallback`] is what the orchestrator uses when hwloc fails at
//!   run time: the `Cpus_allowed_list` of `/proc/self/status` (the same
//!   affinity mask), ascending, with no NUMA or hyperthread information.
//! - [`Topology::from_cpus`] takes a list as given (tests, or a list from the
//!   configuration): no NUMA information, the order kept.
//!
//! # Order: one hardware thread per physical core first
//!
//! On a hyperthreaded machine two PUs of one core share its execution units,
//! so an IF given both gets far less than two cores' worth. The list from
//! hwloc therefore holds the *first* usable PU (lowest OS index) of every
//! physical core first, cores in hwloc's logical order (which keeps the
//! cores of a package / NUMA node together, so the consecutive runs that
//! `split_cores` cuts stay inside one node), then the second PUs of the
//! cores in the same order, then the third, and so on. Only when more IFs
//! than physical cores need a core does one get a sibling.
//! [`Topology::smt_siblings`] says which entries are such siblings. On this
//! project's development machines (2 cores, no SMT, one NUMA node) the list
//! is simply `[0, 1]`.
//!
//! # The NIC
//!
//! A [`NicHint`] names the NIC the if-manager receives on: a PCI address
//! (`0000:3b:00.0`, the form a NIC bound to `vfio-pci` for DPDK has: it has
//! no interface name any more), a Linux interface name (`eth0`, resolved
//! through `/sys/class/net/<name>/device` to its PCI device), a DPDK virtual
//! device (`net_pcap0`, `net_af_packet0`, ...) or nothing.
//! [`Topology::nic_locality`] says which NUMA node it is on and which usable
//! cores are local to it (hwloc's view of the PCI device, else the kernel's
//! `local_cpulist` in sysfs); [`Topology::cores_near_nic`] is [`Topology::cores`]
//! reordered so those come first, each group keeping the order above.
//!
//! Where locality cannot be known it is never guessed: virtual interfaces
//! (`lo`, veth, ifb), DPDK virtual devices, an interface name that does not
//! exist, a PCI address the machine does not have, a device the kernel does
//! not place on a node (`numa_node` -1 and no `local_cpulist`) all give "no
//! locality": [`Topology::cores`] in order and a note saying why. A missing interface
//! is deliberately *not* an error: the NIC may be bound to DPDK (and so have
//! lost its name) or not yet be up, and the orchestrator must still start;
//! the note in [`NicLocality::note`] (and in [`Topology::summary`]) says to
//! give the PCI address instead.
//!
//! # Keeping cores out
//!
//! [`Topology::exclude`] removes cores, e.g. the if-manager's RX core from
//! the IFs' list. It does what it is asked even when that leaves no core:
//! on a 2-core machine keeping one core for RX leaves one for every IF, and
//! whether that is acceptable (or whether the RX core must be shared) is the
//! caller's decision, not this module's.
//!
//! Nothing here panics on bad input or a strange machine: failures are
//! [`TopologyError`] values or notes.

#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use hwlocality::cpu::binding::CpuBindingFlags;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;
use serde::Serialize;
use serde_json::{json, Value};
use thiserror::Error;

/// PCI class of network controllers (the high byte of the class id).
const PCI_CLASS_NETWORK: u16 = 0x02;

/// Why a topology could not be made.
#[derive(Debug, Error)]
pub enum TopologyError {
    /// hwloc failed (building the topology, or a query on it).
    #[error("hwloc: {what}: {reason}")]
    Hwloc {
        /// What was being done.
        what: &'static str,
        /// hwloc's error.
        reason: String,
    },
    /// hwloc's topology has no PU this process may run on.
    #[error("hwloc found no core this process may run on")]
    NoCores,
    /// A Linux CPU list (`0-3,8`) that does not parse.
    #[error("bad CPU list {list:?}: {reason}")]
    BadCpuList {
        /// The list.
        list: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Where a [`Topology`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// [`Topology::discover`]: hwloc.
    Hwloc,
    /// [`Topology::fallback`]: the process's affinity mask, no hwloc.
    Fallback,
    /// [`Topology::from_cpus`]: a list given by the caller.
    Given,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Hwloc => "hwloc",
            Source::Fallback => "fallback",
            Source::Given => "given",
        }
    }
}

/// A NUMA node and its usable cores.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    /// The node's OS index (`/sys/devices/system/node/node<N>`).
    pub os_index: usize,
    /// Its cores this process may use, in [`Topology::cores`] order; empty
    /// for a node with memory only, or whose cores are all excluded.
    pub cpus: Vec<usize>,
}

/// What hwloc knows about one PCI device.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PciDevice {
    /// `dddd:bb:dd.f`, lowercase.
    bus_id: String,
    /// PCI class id (`0x0200` Ethernet).
    class_id: u16,
    /// Usable cores local to it, in [`Topology::cores`] order.
    cpus: Vec<usize>,
    /// Its NUMA node, when its locality is exactly one node.
    node: Option<usize>,
}

/// Facts about the machine, for logs; each one where known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Machine {
    hostname: Option<String>,
    architecture: Option<String>,
    cpu_model: Option<String>,
    packages: Option<usize>,
    /// PUs hwloc sees, usable or not.
    pus_total: Option<usize>,
    /// hwloc API version of the library in use, `X.Y.Z`.
    hwloc_api: Option<String>,
}

/// The NIC the if-manager receives on, as far as the caller knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NicHint {
    /// A PCI address, normalized to `dddd:bb:dd.f` lowercase.
    Pci(String),
    /// A Linux network interface name (`eth0`).
    Interface(String),
    /// A DPDK virtual device (`net_pcap0`, `net_af_packet0`, ...): no
    /// locality.
    Virtual(String),
    /// Not known.
    Unknown,
}

impl NicHint {
    /// Reads a hint from text: a PCI address with or without its domain
    /// (`0000:3b:00.0`, `3b:00.0`) is [`NicHint::Pci`]; a DPDK virtual
    /// device name (`net_...`, anything after a `,` being its arguments) is
    /// [`NicHint::Virtual`]; the empty string, `unknown` and `none` are
    /// [`NicHint::Unknown`]; anything else is an [`NicHint::Interface`] name.
    pub fn parse(s: &str) -> NicHint {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("unknown") || s.eq_ignore_ascii_case("none") {
            return NicHint::Unknown;
        }
        if let Some(addr) = normalize_pci_address(s) {
            return NicHint::Pci(addr);
        }
        if s.starts_with("net_") {
            let name = s.split(',').next().unwrap_or(s);
            return NicHint::Virtual(name.to_string());
        }
        NicHint::Interface(s.to_string())
    }
}

impl fmt::Display for NicHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NicHint::Pci(a) => write!(f, "PCI {a}"),
            NicHint::Interface(n) => write!(f, "interface {n}"),
            NicHint::Virtual(n) => write!(f, "virtual device {n}"),
            NicHint::Unknown => f.write_str("unknown NIC"),
        }
    }
}

/// Where a NIC is, as [`Topology::nic_locality`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicLocality {
    /// The hint asked about.
    pub nic: NicHint,
    /// Its PCI address, when it has one and it was found.
    pub pci: Option<String>,
    /// Its NUMA node, when known.
    pub node: Option<usize>,
    /// Usable cores local to it, in [`Topology::cores`] order. Empty when
    /// the locality is unknown, and when none of its local cores is usable.
    pub local_cores: Vec<usize>,
    /// How it was found, or why it could not be (for logs).
    pub note: String,
}

/// The usable cores of this machine, their order, their NUMA nodes.
///
/// Plain data: cheap to clone, `Send`, no hwloc handle inside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    source: Source,
    /// Usable cores in hand-out order (see the module docs).
    cores: Vec<usize>,
    /// The entries of `cores` that are a second (third, ...) hardware
    /// thread of a physical core already in the list.
    siblings: BTreeSet<usize>,
    numa_nodes: Vec<NumaNode>,
    pci: Vec<PciDevice>,
    machine: Machine,
    notes: Vec<String>,
    /// Root of sysfs (`/sys`; elsewhere in tests).
    sysfs: PathBuf,
}

impl Topology {
    /// The topology of this machine from hwloc, restricted to the cores this
    /// process may run on (hwloc's allowed cpuset and the process's CPU
    /// binding). PCI devices are included so that a NIC's locality is
    /// known; without hwloc's PCI support (`libhwloc-plugins`) there are
    /// none and [`Topology::nic_locality`] falls back to sysfs.
    pub fn discover() -> Result<Topology, TopologyError> {
        let hw = hwlocality::Topology::builder()
            .with_io_type_filter(TypeFilter::KeepImportant)
            .map_err(|e| hwloc_err("keeping PCI devices", e))?
            .build()
            .map_err(|e| hwloc_err("building the topology", e))?;
        let binding = hw.cpu_binding(CpuBindingFlags::PROCESS);
        let mut notes = Vec::new();
        let bound: Option<BTreeSet<usize>> = match &binding {
            Ok(set) => Some(set.iter_set().map(usize::from).collect()),
            Err(e) => {
                notes.push(format!(
                    "could not read this process's CPU binding ({e}); using hwloc's allowed cpuset alone"
                ));
                None
            }
        };
        let mut topo = Self::from_hwloc(&hw, bound.as_ref())?;
        topo.notes.extend(notes);
        Ok(topo)
    }

    /// The topology from an hwloc topology: the PUs in its cpuset and its
    /// allowed cpuset (and in `bound`, when given).
    fn from_hwloc(
        hw: &hwlocality::Topology,
        bound: Option<&BTreeSet<usize>>,
    ) -> Result<Topology, TopologyError> {
        let allowed: BTreeSet<usize> = hw.allowed_cpuset().iter_set().map(usize::from).collect();
        let usable: BTreeSet<usize> = hw
            .cpuset()
            .iter_set()
            .map(usize::from)
            .filter(|c| allowed.contains(c) && bound.is_none_or(|b| b.contains(c)))
            .collect();
        if usable.is_empty() {
            return Err(TopologyError::NoCores);
        }

        // Per physical core, its usable PUs ascending; cores in logical order.
        let mut per_core: Vec<Vec<usize>> = Vec::new();
        let mut placed = BTreeSet::new();
        for core in hw.objects_with_type(ObjectType::Core) {
            let pus: Vec<usize> = object_cpus(core)
                .into_iter()
                .filter(|c| usable.contains(c) && !placed.contains(c))
                .collect();
            placed.extend(pus.iter().copied());
            if !pus.is_empty() {
                per_core.push(pus);
            }
        }
        // PUs in no Core object (hwloc without core information): each its
        // own core.
        per_core.extend(usable.difference(&placed).map(|&c| vec![c]));

        let mut cores = Vec::with_capacity(usable.len());
        let mut siblings = BTreeSet::new();
        let max_threads = per_core.iter().map(Vec::len).max().unwrap_or(0);
        for rank in 0..max_threads {
            for pus in &per_core {
                if let Some(&pu) = pus.get(rank) {
                    cores.push(pu);
                    if rank > 0 {
                        siblings.insert(pu);
                    }
                }
            }
        }

        let numa_nodes = hw
            .objects_with_type(ObjectType::NUMANode)
            .filter_map(|node| {
                let os_index = node.os_index()?;
                let set: BTreeSet<usize> = object_cpus(node).into_iter().collect();
                Some(NumaNode {
                    os_index,
                    cpus: in_order(&cores, &set),
                })
            })
            .collect();

        let pci = hw
            .pci_devices()
            .filter_map(|dev| {
                let Some(ObjectAttributes::PCIDevice(attr)) = dev.attributes() else {
                    return None;
                };
                let bus_id = format!(
                    "{:04x}:{:02x}:{:02x}.{:x}",
                    attr.domain(),
                    attr.bus_id(),
                    attr.bus_device(),
                    attr.function()
                );
                let anchor = dev.first_non_io_ancestor()?;
                let set: BTreeSet<usize> = object_cpus(anchor).into_iter().collect();
                let node = anchor.nodeset().and_then(|ns| {
                    let nodes: Vec<usize> = ns.iter_set().map(usize::from).collect();
                    (nodes.len() == 1).then(|| nodes[0])
                });
                Some(PciDevice {
                    bus_id,
                    class_id: attr.class_id(),
                    cpus: in_order(&cores, &set),
                    node,
                })
            })
            .collect();

        let root = hw.root_object();
        let info = |obj: &TopologyObject, key: &str| {
            obj.info(key)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let api = hwlocality::hwloc_api_version();
        let machine = Machine {
            hostname: info(root, "HostName"),
            architecture: info(root, "Architecture"),
            cpu_model: hw
                .objects_with_type(ObjectType::Package)
                .find_map(|p| info(p, "CPUModel")),
            packages: Some(hw.objects_with_type(ObjectType::Package).len()),
            pus_total: Some(hw.objects_with_type(ObjectType::PU).len()),
            hwloc_api: Some(format!(
                "{}.{}.{}",
                api >> 16,
                (api >> 8) & 0xff,
                api & 0xff
            )),
        };

        Ok(Topology {
            source: Source::Hwloc,
            cores,
            siblings,
            numa_nodes,
            pci,
            machine,
            notes: Vec::new(),
            sysfs: PathBuf::from("/sys"),
        })
    }

    /// The cores of this process's affinity mask, without hwloc: the
    /// `Cpus_allowed_list` of `/proc/self/status`, ascending. For when
    /// [`Topology::discover`] fails. Never fails itself: if that file cannot
    /// be read it takes cores `0..n` with `n` from
    /// [`std::thread::available_parallelism`] (right in count, possibly not
    /// in ids), and if even that fails, core 0; either way with a note.
    pub fn fallback() -> Topology {
        let path = Path::new("/proc/self/status");
        let (cpus, note) = match read_cpus_allowed(path) {
            Ok(cpus) => (cpus, None),
            Err(e) => match std::thread::available_parallelism() {
                Ok(n) => (
                    (0..n.get()).collect(),
                    Some(format!("{e}; assuming cores 0..{n}")),
                ),
                Err(e2) => (vec![0], Some(format!("{e}; {e2}; assuming core 0 only"))),
            },
        };
        let mut topo = Self::from_cpus(cpus);
        topo.source = Source::Fallback;
        topo.notes
            .push("hwloc not used: no NUMA or hyperthread information".into());
        topo.notes.extend(note);
        topo
    }

    /// A topology of exactly these cores, in this order (a core listed twice
    /// counts at its first place), with no NUMA or hyperthread information.
    pub fn from_cpus(cpus: Vec<usize>) -> Topology {
        let mut seen = BTreeSet::new();
        let cores = cpus.into_iter().filter(|c| seen.insert(*c)).collect();
        Topology {
            source: Source::Given,
            cores,
            siblings: BTreeSet::new(),
            numa_nodes: Vec::new(),
            pci: Vec::new(),
            machine: Machine::default(),
            notes: Vec::new(),
            sysfs: PathBuf::from("/sys"),
        }
    }

    /// Where this topology came from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Whether hwloc made it.
    pub fn used_hwloc(&self) -> bool {
        self.source == Source::Hwloc
    }

    /// The usable cores (OS CPU numbers, as `taskset` and
    /// `sched_setaffinity` take them) in hand-out order: one hardware thread
    /// per physical core first, then their siblings (see the module docs).
    pub fn cores(&self) -> &[usize] {
        &self.cores
    }

    /// The entries of [`Topology::cores`] that share a physical core with
    /// an earlier entry (hyperthread siblings), ascending. Empty without
    /// SMT and without hwloc.
    pub fn smt_siblings(&self) -> Vec<usize> {
        self.siblings.iter().copied().collect()
    }

    /// The NUMA nodes, as hwloc numbers them; empty without hwloc. A machine
    /// without NUMA has one node.
    pub fn numa_nodes(&self) -> &[NumaNode] {
        &self.numa_nodes
    }

    /// Things worth a log line: hwloc not used, a query that failed, cores
    /// excluded.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// This topology without `cpus`: removed from the cores, the NUMA nodes
    /// and the NIC localities, the rest keeping its order. Cores not in the
    /// topology are ignored. It may leave no core at all (2 cores, one kept
    /// for the if-manager's RX, two IFs): whether the caller can afford to
    /// exclude is its decision; check [`Topology::cores`] afterwards.
    pub fn exclude(&self, cpus: &[usize]) -> Topology {
        let out: BTreeSet<usize> = cpus.iter().copied().collect();
        let keep = |list: &[usize]| -> Vec<usize> {
            list.iter().copied().filter(|c| !out.contains(c)).collect()
        };
        let mut topo = self.clone();
        topo.cores = keep(&self.cores);
        topo.siblings.retain(|c| !out.contains(c));
        for node in &mut topo.numa_nodes {
            node.cpus = keep(&node.cpus);
        }
        for dev in &mut topo.pci {
            dev.cpus = keep(&dev.cpus);
        }
        let removed: Vec<usize> = self
            .cores
            .iter()
            .copied()
            .filter(|c| out.contains(c))
            .collect();
        if !removed.is_empty() {
            topo.notes.push(format!("cores {removed:?} excluded"));
        }
        topo
    }

    /// Where `nic` is: its PCI address, NUMA node and local usable cores,
    /// or a note saying why that is not known (see the module docs).
    pub fn nic_locality(&self, nic: &NicHint) -> NicLocality {
        let unknown = |pci: Option<String>, note: String| NicLocality {
            nic: nic.clone(),
            pci,
            node: None,
            local_cores: Vec::new(),
            note,
        };
        let addr = match nic {
            NicHint::Unknown => {
                return unknown(
                    None,
                    "NIC not given: no locality, all cores in order".into(),
                )
            }
            NicHint::Virtual(name) => {
                return unknown(
                    None,
                    format!("{name} is a DPDK virtual device: no locality, all cores in order"),
                )
            }
            NicHint::Pci(addr) => match normalize_pci_address(addr) {
                Some(a) => a,
                None => return unknown(None, format!("{addr:?} is not a PCI address")),
            },
            NicHint::Interface(name) => match interface_pci_address(&self.sysfs, name) {
                Ok(a) => a,
                Err(why) => {
                    return unknown(None, format!("{why}: no locality, all cores in order"))
                }
            },
        };

        // hwloc's view first.
        if let Some(dev) = self.pci.iter().find(|d| d.bus_id == addr) {
            return self.locality_from(nic, addr, dev.node, dev.cpus.clone(), "hwloc");
        }
        // The kernel's.
        let dev_dir = self.sysfs.join("bus/pci/devices").join(&addr);
        if !dev_dir.exists() {
            return unknown(
                Some(addr.clone()),
                format!("no PCI device {addr} on this machine: no locality, all cores in order"),
            );
        }
        let node = std::fs::read_to_string(dev_dir.join("numa_node"))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .and_then(|n| usize::try_from(n).ok())
            // -1 ("no node") on a machine with one node: that node.
            .or(match self.numa_nodes.as_slice() {
                [only] => Some(only.os_index),
                _ => None,
            });
        let local: Option<BTreeSet<usize>> = std::fs::read_to_string(dev_dir.join("local_cpulist"))
            .ok()
            .and_then(|s| parse_cpu_list(&s).ok())
            .map(|v| v.into_iter().collect())
            .or_else(|| {
                let n = node?;
                let node = self.numa_nodes.iter().find(|x| x.os_index == n)?;
                Some(node.cpus.iter().copied().collect())
            });
        match local {
            Some(set) => {
                let cpus = in_order(&self.cores, &set);
                self.locality_from(nic, addr, node, cpus, "sysfs")
            }
            None => unknown(
                Some(addr.clone()),
                format!("the kernel does not say where {addr} is: no locality, all cores in order"),
            ),
        }
    }

    fn locality_from(
        &self,
        nic: &NicHint,
        addr: String,
        node: Option<usize>,
        local_cores: Vec<usize>,
        how: &str,
    ) -> NicLocality {
        let on = match node {
            Some(n) => format!("NUMA node {n}"),
            None => "no single NUMA node".into(),
        };
        let note = if local_cores.is_empty() {
            format!(
                "{nic} is {addr} on {on} ({how}), none of its local cores usable: all cores in order"
            )
        } else if local_cores.len() == self.cores.len() {
            format!(
                "{nic} is {addr} on {on} ({how}), local to all {} usable cores",
                self.cores.len()
            )
        } else {
            format!(
                "{nic} is {addr} on {on} ({how}), local to {} of {} usable cores",
                local_cores.len(),
                self.cores.len()
            )
        };
        NicLocality {
            nic: nic.clone(),
            pci: Some(addr),
            node,
            local_cores,
            note,
        }
    }

    /// [`Topology::cores`] with the cores local to `nic` first, the others
    /// after, each group in [`Topology::cores`] order. Where the locality is
    /// not known (see [`Topology::nic_locality`]) this is just
    /// [`Topology::cores`].
    pub fn cores_near_nic(&self, nic: &NicHint) -> Vec<usize> {
        let local: BTreeSet<usize> = self.nic_locality(nic).local_cores.into_iter().collect();
        let (mut near, far): (Vec<usize>, Vec<usize>) =
            self.cores.iter().partition(|c| local.contains(c));
        near.extend(far);
        near
    }

    /// For the orchestrator's status and logs: where the topology came from,
    /// the machine, the cores in order, the NUMA nodes, the network PCI
    /// devices hwloc saw, and where `nic` is (pass [`NicHint::Unknown`] when
    /// there is none).
    pub fn summary(&self, nic: &NicHint) -> Value {
        let loc = self.nic_locality(nic);
        let nic_name = match nic {
            NicHint::Pci(s) | NicHint::Interface(s) | NicHint::Virtual(s) => Some(s.as_str()),
            NicHint::Unknown => None,
        };
        let nics: Vec<Value> = self
            .pci
            .iter()
            .filter(|d| d.class_id >> 8 == PCI_CLASS_NETWORK)
            .map(|d| json!({"pci": d.bus_id, "numa_node": d.node, "cores": d.cpus}))
            .collect();
        let m = &self.machine;
        json!({
            "source": self.source.as_str(),
            "hwloc": self.used_hwloc(),
            "machine": {
                "hostname": m.hostname,
                "architecture": m.architecture,
                "cpu_model": m.cpu_model,
                "packages": m.packages,
                "pus_total": m.pus_total,
                "hwloc_api": m.hwloc_api,
            },
            "cores": self.cores,
            "smt_siblings": self.smt_siblings(),
            "numa_nodes": self.numa_nodes,
            "network_pci_devices": nics,
            "nic": {
                "hint": nic_name,
                "pci": loc.pci,
                "numa_node": loc.node,
                "local_cores": loc.local_cores,
                "note": loc.note,
            },
            "notes": self.notes,
        })
    }
}

/// Parses a Linux CPU list: [`kp_os::affinity::parse_cpu_list`].
pub fn parse_cpu_list(list: &str) -> Result<Vec<usize>, TopologyError> {
    kp_os::affinity::parse_cpu_list(list).map_err(|e| TopologyError::BadCpuList {
        list: e.list,
        reason: e.reason,
    })
}

/// The CPUs of `Cpus_allowed_list` in a `/proc/<pid>/status` file.
fn read_cpus_allowed(path: &Path) -> Result<Vec<usize>, TopologyError> {
    let text = std::fs::read_to_string(path).map_err(|source| TopologyError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let list = text
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .ok_or_else(|| TopologyError::BadCpuList {
            list: String::new(),
            reason: format!("no Cpus_allowed_list in {}", path.display()),
        })?;
    let cpus = parse_cpu_list(list)?;
    if cpus.is_empty() {
        return Err(TopologyError::BadCpuList {
            list: list.trim().to_string(),
            reason: "no CPU allowed".into(),
        });
    }
    Ok(cpus)
}

/// `dddd:bb:dd.f` lowercase, for a PCI address with or without domain;
/// `None` for anything else.
fn normalize_pci_address(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, devfn) = match parts.as_slice() {
        [d, b, df] => (*d, *b, *df),
        [b, df] => ("0000", *b, *df),
        _ => return None,
    };
    let (dev, func) = devfn.split_once('.')?;
    let hex = |t: &str, max_len: usize| {
        (!t.is_empty() && t.len() <= max_len && t.bytes().all(|c| c.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(t, 16).ok())
            .flatten()
    };
    let (d, b, v, f) = (hex(domain, 8)?, hex(bus, 2)?, hex(dev, 2)?, hex(func, 1)?);
    if v > 0x1f || f > 7 {
        return None;
    }
    Some(format!("{d:04x}:{b:02x}:{v:02x}.{f:x}"))
}

/// The PCI address of interface `name`: `<sysfs>/class/net/<name>/device`
/// resolved, then the nearest PCI device up its path (a virtio NIC's
/// `device` is `.../0000:00:03.0/virtio2`). `Err` says why there is none.
fn interface_pci_address(sysfs: &Path, name: &str) -> Result<String, String> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(format!("{name:?} is not an interface name"));
    }
    let iface = sysfs.join("class/net").join(name);
    if !iface.exists() {
        return Err(format!(
            "no interface {name} (a NIC bound to DPDK has none: give its PCI address)"
        ));
    }
    let device = iface.join("device");
    let Ok(real) = std::fs::canonicalize(&device) else {
        return Err(format!("interface {name} is virtual (no device)"));
    };
    real.ancestors()
        .filter_map(|p| p.file_name()?.to_str())
        .find_map(|c| {
            // Only the full form: sysfs always writes the domain.
            (c.matches(':').count() == 2)
                .then(|| normalize_pci_address(c))
                .flatten()
        })
        .ok_or_else(|| format!("interface {name} is not on a PCI device"))
}

/// The OS indices of the PUs in an object's cpuset, ascending.
fn object_cpus(obj: &TopologyObject) -> Vec<usize> {
    obj.cpuset()
        .map(|set| set.iter_set().map(usize::from).collect())
        .unwrap_or_default()
}

/// The entries of `order` that are in `set`, in `order`'s order.
fn in_order(order: &[usize], set: &BTreeSet<usize>) -> Vec<usize> {
    order.iter().copied().filter(|c| set.contains(c)).collect()
}

fn hwloc_err(what: &'static str, e: impl fmt::Display) -> TopologyError {
    TopologyError::Hwloc {
        what,
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Usable cores per NUMA node.
    fn per_node(topo: &Topology) -> BTreeMap<usize, usize> {
        topo.numa_nodes
            .iter()
            .map(|n| (n.os_index, n.cpus.len()))
            .collect()
    }

    #[test]
    fn discover_agrees_with_the_fallback() {
        let hw = Topology::discover().expect("hwloc works on this machine");
        let fb = Topology::fallback();
        assert!(hw.used_hwloc());
        assert_eq!(fb.source(), Source::Fallback);
        assert!(!hw.cores().is_empty());
        let mut a = hw.cores().to_vec();
        a.sort_unstable();
        assert_eq!(a, fb.cores(), "hwloc {hw:?}\nfallback {fb:?}");
        // Physical cores first: no sibling before the last primary.
        let sib = hw.smt_siblings();
        let first_sib = hw.cores().iter().position(|c| sib.contains(c));
        if let Some(i) = first_sib {
            assert!(hw.cores()[i..].iter().all(|c| sib.contains(c)));
        }
        // Every usable core is on exactly one node; at least one node.
        assert!(!hw.numa_nodes().is_empty());
        let mut on_nodes: Vec<usize> = hw
            .numa_nodes()
            .iter()
            .flat_map(|n| n.cpus.clone())
            .collect();
        on_nodes.sort_unstable();
        assert_eq!(on_nodes, a);
        let s = hw.summary(&NicHint::Unknown);
        assert_eq!(s["hwloc"], true);
        assert_eq!(s["source"], "hwloc");
        assert_eq!(s["cores"].as_array().map(Vec::len), Some(a.len()));
        assert!(s["machine"]["hwloc_api"]
            .as_str()
            .is_some_and(|v| v.starts_with("2.")));
        let s = fb.summary(&NicHint::Unknown);
        assert_eq!(s["hwloc"], false);
        assert!(s["numa_nodes"].as_array().is_some_and(Vec::is_empty));
    }

    #[test]
    fn synthetic_smt_machine_puts_one_thread_per_core_first() {
        let hw = hwlocality::Topology::builder()
            .from_synthetic("pack:2 numa:1 core:2 pu:2")
            .expect("synthetic description")
            .build()
            .expect("synthetic topology");
        let t = Topology::from_hwloc(&hw, None).expect("topology");
        // PUs: package 0 = cores {0,1},{2,3}; package 1 = {4,5},{6,7}.
        assert_eq!(t.cores(), &[0, 2, 4, 6, 1, 3, 5, 7]);
        assert_eq!(t.smt_siblings(), vec![1, 3, 5, 7]);
        assert_eq!(
            t.numa_nodes(),
            &[
                NumaNode {
                    os_index: 0,
                    cpus: vec![0, 2, 1, 3]
                },
                NumaNode {
                    os_index: 1,
                    cpus: vec![4, 6, 5, 7]
                },
            ]
        );
        assert_eq!(per_node(&t), BTreeMap::from([(0, 4), (1, 4)]));
        // A binding restricts the usable cores; a core with one usable PU
        // is then a physical core like the others.
        let bound: BTreeSet<usize> = [1, 2, 3, 6].into();
        let t = Topology::from_hwloc(&hw, Some(&bound)).expect("topology");
        assert_eq!(t.cores(), &[1, 2, 6, 3]);
        assert_eq!(t.smt_siblings(), vec![3]);
        assert!(matches!(
            Topology::from_hwloc(&hw, Some(&BTreeSet::from([99]))),
            Err(TopologyError::NoCores)
        ));
    }

    /// A topology with two NUMA nodes and one NIC on node 1.
    fn two_nodes() -> Topology {
        let mut t = Topology::from_cpus(vec![0, 1, 2, 3, 4, 5]);
        t.source = Source::Hwloc;
        t.numa_nodes = vec![
            NumaNode {
                os_index: 0,
                cpus: vec![0, 1, 2],
            },
            NumaNode {
                os_index: 1,
                cpus: vec![3, 4, 5],
            },
        ];
        t.pci = vec![PciDevice {
            bus_id: "0000:3b:00.0".into(),
            class_id: 0x0200,
            cpus: vec![3, 4, 5],
            node: Some(1),
        }];
        t
    }

    #[test]
    fn cores_near_a_known_nic_come_first() {
        let t = two_nodes();
        let nic = NicHint::parse("3B:00.0");
        assert_eq!(nic, NicHint::Pci("0000:3b:00.0".into()));
        assert_eq!(t.cores_near_nic(&nic), vec![3, 4, 5, 0, 1, 2]);
        let loc = t.nic_locality(&nic);
        assert_eq!(loc.node, Some(1));
        assert_eq!(loc.pci.as_deref(), Some("0000:3b:00.0"));
        assert!(loc.note.contains("hwloc"), "{}", loc.note);
        let s = t.summary(&nic);
        assert_eq!(s["nic"]["numa_node"], 1);
        assert_eq!(s["network_pci_devices"][0]["pci"], "0000:3b:00.0");
        // Excluding a local core keeps the rest of the order.
        let t = t.exclude(&[4, 0, 42]);
        assert_eq!(t.cores(), &[1, 2, 3, 5]);
        assert_eq!(t.cores_near_nic(&nic), vec![3, 5, 1, 2]);
        assert_eq!(t.numa_nodes()[1].cpus, vec![3, 5]);
        assert!(t.notes().iter().any(|n| n.contains("[0, 4]")));
        // All local cores excluded: no local core, all in order.
        let t = t.exclude(&[3, 5]);
        assert_eq!(t.cores_near_nic(&nic), vec![1, 2]);
        assert!(t
            .nic_locality(&nic)
            .note
            .contains("none of its local cores"));
    }

    #[test]
    fn loopback_has_no_locality() {
        let t = Topology::discover().unwrap_or_else(|_| Topology::fallback());
        let lo = NicHint::parse("lo");
        assert_eq!(lo, NicHint::Interface("lo".into()));
        let loc = t.nic_locality(&lo);
        assert!(loc.local_cores.is_empty());
        assert_eq!(loc.pci, None);
        assert!(loc.note.contains("virtual"), "{}", loc.note);
        assert_eq!(t.cores_near_nic(&lo), t.cores());
    }

    #[test]
    fn a_missing_interface_is_unknown_not_an_error() {
        let t = Topology::discover().unwrap_or_else(|_| Topology::fallback());
        let nic = NicHint::Interface("kp-no-such-if0".into());
        let loc = t.nic_locality(&nic);
        assert!(loc.local_cores.is_empty());
        assert!(loc.note.contains("no interface"), "{}", loc.note);
        assert!(loc.note.contains("PCI address"), "{}", loc.note);
        assert_eq!(t.cores_near_nic(&nic), t.cores());
        // Path tricks are not interface names.
        let loc = t.nic_locality(&NicHint::Interface("../lo".into()));
        assert!(loc.note.contains("not an interface name"), "{}", loc.note);
        // A PCI address the machine does not have.
        let nic = NicHint::Pci("00ff:ff:1f.7".into());
        assert!(t.nic_locality(&nic).note.contains("no PCI device"));
        assert_eq!(t.cores_near_nic(&nic), t.cores());
        // Virtual devices and nothing.
        for nic in [
            NicHint::parse("net_pcap0,rx_pcap=x.pcap"),
            NicHint::parse(""),
        ] {
            assert!(matches!(nic, NicHint::Virtual(_) | NicHint::Unknown));
            assert_eq!(t.cores_near_nic(&nic), t.cores());
        }
        assert_eq!(
            NicHint::parse("net_pcap0,rx_pcap=x.pcap"),
            NicHint::Virtual("net_pcap0".into())
        );
    }

    /// A fake sysfs: a virtio NIC on PCI 0000:00:03.0 local to cores 2-3,
    /// and a virtual interface.
    #[test]
    fn interface_resolves_through_sysfs_to_its_pci_device() {
        use std::os::unix::fs::symlink;
        let root = std::env::temp_dir().join(format!("kp-topology-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pci = root.join("devices/pci0000:00/0000:00:03.0");
        std::fs::create_dir_all(pci.join("virtio2/net/eth9")).unwrap();
        std::fs::create_dir_all(root.join("devices/virtual/net/veth9")).unwrap();
        std::fs::create_dir_all(root.join("class/net")).unwrap();
        std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        std::fs::write(pci.join("numa_node"), "-1\n").unwrap();
        std::fs::write(pci.join("local_cpulist"), "2-3\n").unwrap();
        symlink(pci.join("virtio2"), pci.join("virtio2/net/eth9/device")).unwrap();
        symlink(pci.join("virtio2/net/eth9"), root.join("class/net/eth9")).unwrap();
        symlink(
            root.join("devices/virtual/net/veth9"),
            root.join("class/net/veth9"),
        )
        .unwrap();
        symlink(&pci, root.join("bus/pci/devices/0000:00:03.0")).unwrap();

        let mut t = Topology::from_cpus(vec![0, 1, 2, 3]);
        t.sysfs = root.clone();
        let eth9 = NicHint::Interface("eth9".into());
        let loc = t.nic_locality(&eth9);
        assert_eq!(loc.pci.as_deref(), Some("0000:00:03.0"));
        assert_eq!(loc.node, None);
        assert_eq!(loc.local_cores, vec![2, 3]);
        assert!(loc.note.contains("sysfs"), "{}", loc.note);
        assert_eq!(t.cores_near_nic(&eth9), vec![2, 3, 0, 1]);
        assert_eq!(
            t.cores_near_nic(&NicHint::Pci("0000:00:03.0".into())),
            vec![2, 3, 0, 1]
        );
        let veth = t.nic_locality(&NicHint::Interface("veth9".into()));
        assert!(veth.note.contains("virtual"), "{}", veth.note);
        assert_eq!(
            t.cores_near_nic(&NicHint::Interface("veth9".into())),
            t.cores()
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn from_cpus_keeps_order_and_exclude_keeps_the_rest() {
        let t = Topology::from_cpus(vec![3, 1, 3, 2, 0]);
        assert_eq!(t.source(), Source::Given);
        assert_eq!(t.cores(), &[3, 1, 2, 0]);
        assert!(t.numa_nodes().is_empty());
        assert!(t.smt_siblings().is_empty());
        assert_eq!(t.exclude(&[1]).cores(), &[3, 2, 0]);
        assert_eq!(t.exclude(&[]).cores(), t.cores());
        assert_eq!(t.exclude(&[7]), t, "absent cores change nothing");
        // Two cores, one kept for RX: one left; both: none, the caller's call.
        let two = Topology::from_cpus(vec![0, 1]);
        assert_eq!(two.exclude(&[0]).cores(), &[1]);
        assert!(two.exclude(&[0, 1]).cores().is_empty());
    }

    #[test]
    fn pci_addresses_normalize() {
        assert_eq!(
            normalize_pci_address("0000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            normalize_pci_address("af:1f.7").as_deref(),
            Some("0000:af:1f.7")
        );
        for bad in [
            "eth0",
            "0000:3b:00",
            "3b:20.0",
            "3b:00.8",
            "x:00.0",
            "net_pcap0",
        ] {
            assert_eq!(normalize_pci_address(bad), None, "{bad}");
        }
        assert_eq!(NicHint::parse("eth0"), NicHint::Interface("eth0".into()));
        assert_eq!(NicHint::parse("unknown"), NicHint::Unknown);
    }
}
