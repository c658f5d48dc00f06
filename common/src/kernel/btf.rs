//! Kernel types from BTF (`/sys/kernel/btf/vmlinux`): function prototypes (so
//! trace can name arguments), struct members resolved to offsets at start-up
//! (trace's `a->b.c`, the compat check of syscall events), and C spellings of
//! types for `--args` and signature checks. No kernel headers.

use anyhow::{Context, Result};
use libbpf_rs::btf::types::{self, IntEncoding, MemberAttr};
use libbpf_rs::btf::{BtfKind, BtfType, TypeId};
use libbpf_rs::{Btf, HasSize, ReferencesType};

/// A kernel value's type, as trace's compiler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ty {
    Int {
        bytes: u8,
        signed: bool,
    },
    Ptr(Box<Ty>),
    Array(Box<Ty>, u32),
    /// A kernel struct or union, by BTF id (and its C name for messages).
    Record(u32, String),
    Void,
    /// A tracepoint's `__data_loc char[]` string.
    DataLoc,
}

impl Ty {
    pub const U64: Ty = Ty::Int {
        bytes: 8,
        signed: false,
    };

    pub fn bytes(&self) -> u32 {
        match self {
            Ty::Int { bytes, .. } => *bytes as u32,
            Ty::Array(e, n) => e.bytes() * n,
            Ty::DataLoc => 4,
            _ => 8,
        }
    }

    pub fn signed(&self) -> bool {
        matches!(self, Ty::Int { signed: true, .. })
    }

    pub fn is_char_array(&self) -> bool {
        matches!(self, Ty::Array(e, _) if matches!(**e, Ty::Int { bytes: 1, .. }))
    }

    pub fn name(&self) -> String {
        match self {
            Ty::Int { bytes, signed } => {
                format!("{}{}", if *signed { "s" } else { "u" }, bytes * 8)
            }
            Ty::Ptr(t) => format!("{} *", t.name()),
            Ty::Array(t, n) => format!("{}[{n}]", t.name()),
            Ty::Record(_, n) => n.clone(),
            Ty::Void => "void".into(),
            Ty::DataLoc => "__data_loc char[]".into(),
        }
    }
}

pub struct Kbtf {
    btf: Btf<'static>,
}

/// A kernel function's parameters (name, type id) and return type id.
#[derive(Clone)]
pub struct Proto {
    pub params: Vec<(String, u32)>,
    pub ret: u32,
}

impl Kbtf {
    pub fn load() -> Result<Kbtf> {
        Ok(Kbtf {
            btf: Btf::from_vmlinux().context(
                "reading the kernel's BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF)",
            )?,
        })
    }

    fn by_id(&self, id: u32) -> Option<BtfType<'_>> {
        self.btf.type_by_id::<BtfType>(TypeId::from(id))
    }

    /// The prototype of kernel function `name`.
    pub fn func(&self, name: &str) -> Option<Proto> {
        let f: types::Func = self.btf.type_by_name(name)?;
        let proto = types::FuncProto::try_from(f.referenced_type()).ok()?;
        let params = proto
            .iter()
            .map(|p| {
                (
                    p.name
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    u32::from(p.ty),
                )
            })
            .collect();
        Some(Proto {
            params,
            ret: u32::from(proto.referenced_type_id()),
        })
    }

    /// `struct NAME` / `union NAME` by name.
    pub fn record(&self, kw: &str, name: &str) -> Option<u32> {
        let want = if kw == "union" {
            BtfKind::Union
        } else {
            BtfKind::Struct
        };
        self.find(name, want)
    }

    /// The BTF id of kernel function `name` (what fentry programs attach by).
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.find(name, BtfKind::Func)
    }

    fn find(&self, name: &str, kind: BtfKind) -> Option<u32> {
        let c = std::ffi::CString::new(name).ok()?;
        // SAFETY: a valid BTF object and C string.
        let id = unsafe {
            libbpf_sys::btf__find_by_name_kind(
                libbpf_rs::AsRawLibbpf::as_libbpf_object(&self.btf).as_ptr(),
                c.as_ptr(),
                kind as u32,
            )
        };
        (id > 0).then_some(id as u32)
    }

    /// The type `id` as the compiler's [`Ty`].
    pub fn ty(&self, id: u32) -> Ty {
        let Some(t) = self.by_id(id) else {
            return Ty::U64;
        };
        let t = t.skip_mods_and_typedefs();
        match t.kind() {
            BtfKind::Void => Ty::Void,
            BtfKind::Int => match types::Int::try_from(t) {
                Ok(i) => Ty::Int {
                    bytes: (i.size() as u8).clamp(1, 8),
                    signed: matches!(i.encoding, IntEncoding::Signed),
                },
                Err(_) => Ty::U64,
            },
            BtfKind::Enum => match types::Enum::try_from(t) {
                Ok(e) => Ty::Int {
                    bytes: (e.size() as u8).clamp(1, 8),
                    signed: e.is_signed(),
                },
                Err(_) => Ty::U64,
            },
            BtfKind::Enum64 => Ty::U64,
            BtfKind::Ptr => match types::Ptr::try_from(t) {
                Ok(p) => Ty::Ptr(Box::new(self.ty(u32::from(p.referenced_type_id())))),
                Err(_) => Ty::Ptr(Box::new(Ty::Void)),
            },
            BtfKind::Array => match types::Array::try_from(t) {
                Ok(a) => Ty::Array(Box::new(self.ty(u32::from(a.ty()))), a.capacity() as u32),
                Err(_) => Ty::U64,
            },
            BtfKind::Struct | BtfKind::Union => {
                let kw = if t.kind() == BtfKind::Union {
                    "union"
                } else {
                    "struct"
                };
                let name = t
                    .name()
                    .map(|n| format!("{kw} {}", n.to_string_lossy()))
                    .unwrap_or_else(|| format!("{kw} (anonymous)"));
                Ty::Record(u32::from(t.type_id()), name)
            }
            BtfKind::Fwd => Ty::Record(
                u32::from(t.type_id()),
                t.name()
                    .map(|n| format!("struct {}", n.to_string_lossy()))
                    .unwrap_or_default(),
            ),
            BtfKind::FuncProto => Ty::Void,
            _ => Ty::U64,
        }
    }

    /// Member `name` of struct/union `id`, looked for in anonymous members too:
    /// its byte offset and type id.
    pub fn member(&self, id: u32, name: &str) -> Result<(u32, u32), String> {
        let Some(t) = self.by_id(id) else {
            return Err("unknown type".into());
        };
        if t.kind() == BtfKind::Fwd {
            return Err("its definition is not in the kernel's BTF".into());
        }
        match self.find_member(id, name, 0, 0) {
            Some(Ok(found)) => Ok(found),
            Some(Err(e)) => Err(e),
            None => {
                let mut names = self.member_names(id);
                names.truncate(12);
                Err(format!(
                    "no member '{name}' (members: {})",
                    names.join(", ")
                ))
            }
        }
    }

    fn find_member(
        &self,
        id: u32,
        name: &str,
        base: u32,
        depth: u32,
    ) -> Option<Result<(u32, u32), String>> {
        if depth > 8 {
            return None;
        }
        let t = self.by_id(id)?.skip_mods_and_typedefs();
        let c = types::Composite::try_from(t).ok()?;
        for m in c.iter() {
            let (bits, bitfield) = match m.attr {
                MemberAttr::Normal { offset } => (offset, false),
                MemberAttr::BitField { offset, .. } => (offset, true),
            };
            let mname = m.name.map(|n| n.to_string_lossy().into_owned());
            match mname.as_deref() {
                Some(n) if n == name => {
                    if bitfield || bits % 8 != 0 {
                        return Some(Err(format!(
                            "member '{name}' is a bitfield, which cannot be read by its byte offset"
                        )));
                    }
                    return Some(Ok((base + bits / 8, u32::from(m.ty))));
                }
                None | Some("") => {
                    if let Some(r) =
                        self.find_member(u32::from(m.ty), name, base + bits / 8, depth + 1)
                    {
                        return Some(r);
                    }
                }
                _ => {}
            }
        }
        None
    }

    fn member_names(&self, id: u32) -> Vec<String> {
        let Some(t) = self.by_id(id) else {
            return Vec::new();
        };
        let Ok(c) = types::Composite::try_from(t.skip_mods_and_typedefs()) else {
            return Vec::new();
        };
        c.iter()
            .filter_map(|m| m.name.map(|n| n.to_string_lossy().into_owned()))
            .filter(|n| !n.is_empty())
            .collect()
    }

    /// The C spelling of type `id` (`struct sock *`, `size_t`, `const char *`).
    pub fn c_name(&self, id: u32) -> String {
        self.c_name_depth(id, 0)
    }

    fn c_name_depth(&self, id: u32, depth: u32) -> String {
        if depth > 16 {
            return "?".into();
        }
        let Some(t) = self.by_id(id) else {
            return "void".into();
        };
        let name = || t.name().map(|n| n.to_string_lossy().into_owned());
        match t.kind() {
            BtfKind::Void => "void".into(),
            BtfKind::Int | BtfKind::Typedef | BtfKind::Float => name().unwrap_or_default(),
            BtfKind::Struct => format!("struct {}", name().unwrap_or_default()),
            BtfKind::Union => format!("union {}", name().unwrap_or_default()),
            BtfKind::Enum | BtfKind::Enum64 => format!("enum {}", name().unwrap_or_default()),
            BtfKind::Fwd => format!("struct {}", name().unwrap_or_default()),
            BtfKind::Const | BtfKind::Volatile | BtfKind::Restrict | BtfKind::TypeTag => {
                let next = t.next_type().map(|n| u32::from(n.type_id())).unwrap_or(0);
                let inner = self.c_name_depth(next, depth + 1);
                match t.kind() {
                    BtfKind::Const => format!("const {inner}"),
                    BtfKind::Volatile => format!("volatile {inner}"),
                    _ => inner,
                }
            }
            BtfKind::Ptr => {
                let next = t.next_type().map(|n| u32::from(n.type_id())).unwrap_or(0);
                let inner = self.c_name_depth(next, depth + 1);
                if inner.ends_with('*') {
                    format!("{inner}*")
                } else {
                    format!("{inner} *")
                }
            }
            BtfKind::Array => match types::Array::try_from(t) {
                Ok(a) => format!(
                    "{}[{}]",
                    self.c_name_depth(u32::from(a.ty()), depth + 1),
                    a.capacity()
                ),
                Err(_) => "?".into(),
            },
            BtfKind::FuncProto => "void (*)()".into(),
            _ => name().unwrap_or_else(|| "?".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's BTF (this machine's kernel has it; ENVIRONMENT.md).
    fn kernel() -> Kbtf {
        Kbtf::load().expect("the kernel's BTF")
    }

    #[test]
    fn members_resolve_to_byte_offsets_and_types() {
        let b = kernel();
        let list = b.record("struct", "list_head").expect("struct list_head");
        let (off, ty) = b.member(list, "prev").unwrap();
        assert_eq!(off, 8);
        assert_eq!(b.c_name(ty), "struct list_head *");
        assert_eq!(b.member(list, "next").unwrap().0, 0);
    }

    #[test]
    fn members_of_anonymous_structs_and_unions_are_found() {
        // struct qspinlock { union { atomic_t val; struct { u8 locked; u8 pending; };
        // struct { u16 locked_pending; u16 tail; }; }; } on little-endian x86.
        let b = kernel();
        let q = b.record("struct", "qspinlock").expect("struct qspinlock");
        let (pending, ty) = b.member(q, "pending").unwrap();
        assert_eq!(pending, 1);
        assert_eq!(
            b.ty(ty),
            Ty::Int {
                bytes: 1,
                signed: false
            }
        );
        assert_eq!(b.member(q, "tail").unwrap().0, 2);
        // An anonymous union at offset 16 of an anonymous struct: offsets add up.
        let skb = b.record("struct", "sk_buff").expect("struct sk_buff");
        let (dev, ty) = b.member(skb, "dev").unwrap();
        assert_eq!(dev, 16);
        assert_eq!(b.c_name(ty), "struct net_device *");
    }

    #[test]
    fn bitfields_and_missing_members_are_refused_with_reasons() {
        let b = kernel();
        let skb = b.record("struct", "sk_buff").expect("struct sk_buff");
        let e = b.member(skb, "cloned").unwrap_err();
        assert!(e.contains("'cloned' is a bitfield"), "{e}");
        let list = b.record("struct", "list_head").unwrap();
        assert_eq!(
            b.member(list, "nope").unwrap_err(),
            "no member 'nope' (members: next, prev)"
        );
        assert!(b.record("struct", "tracekit_no_such_struct").is_none());
        assert!(b.record("union", "list_head").is_none());
    }

    #[test]
    fn functions_are_found_by_name() {
        let b = kernel();
        let id = b.func_id("vfs_read").expect("vfs_read");
        assert!(b.func_id("tracekit_no_such_function").is_none());
        let p = b.func("vfs_read").expect("vfs_read's prototype");
        let names: Vec<&str> = p.params.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["file", "buf", "count", "pos"]);
        assert_eq!(b.c_name(p.params[0].1), "struct file *");
        assert_eq!(b.c_name(p.ret), "ssize_t");
        assert!(id > 0);
    }
}
