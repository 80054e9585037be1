//! What this CPU can run, detected once per process from the CPU itself (never from the build
//! machine: the wheel targets baseline x86-64), and optionally capped to a lower tier by the
//! `FERROLLM_CPU_ISA` environment variable so one machine can exercise the paths another takes
//! (`avx2` behaves as an AVX2-only CPU such as AMD Zen 2/3; `baseline` as one without AVX2).
//!
//! Every kernel choice in the crate reads `CpuFeatures::get()`, and Python reads the same value
//! (`ferrollm._core.cpu_features`), so the Rust kernels and the torch paths agree on the tier.

use std::sync::OnceLock;

/// The environment variable that caps the detected features (see `IsaCap`).
pub const ISA_ENV: &str = "FERROLLM_CPU_ISA";

/// How far the detected features are used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsaCap {
    /// Everything the CPU has (the default).
    Native,
    /// At most what an AVX2-only x86-64 CPU has: AVX2, FMA and F16C; no AVX-512, AVX-VNNI,
    /// AVX-NE-CONVERT or AMX.
    Avx2,
    /// None of the features below: the portable code everywhere.
    Baseline,
}

impl IsaCap {
    /// The cap `value` names (`native`, `avx2`, `baseline`; case-insensitive; empty = native).
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "native" => Ok(Self::Native),
            "avx2" => Ok(Self::Avx2),
            "baseline" => Ok(Self::Baseline),
            other => Err(format!(
                "`{ISA_ENV}` must be one of native, avx2, baseline; got {other:?}"
            )),
        }
    }

    /// The name `parse` reads back.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Avx2 => "avx2",
            Self::Baseline => "baseline",
        }
    }
}

/// Names of the features tracked, as Linux's `/proc/cpuinfo` spells them, with the widest cap
/// under which each stays visible.
const FEATURES: [(&str, IsaCap); 15] = [
    ("avx2", IsaCap::Avx2),
    ("fma", IsaCap::Avx2),
    ("f16c", IsaCap::Avx2),
    ("avx_vnni", IsaCap::Native),
    ("avx_ne_convert", IsaCap::Native),
    ("avx512f", IsaCap::Native),
    ("avx512bw", IsaCap::Native),
    ("avx512vl", IsaCap::Native),
    ("avx512dq", IsaCap::Native),
    ("avx512_vnni", IsaCap::Native),
    ("avx512_bf16", IsaCap::Native),
    ("amx_tile", IsaCap::Native),
    ("amx_bf16", IsaCap::Native),
    ("amx_int8", IsaCap::Native),
    // Arm's bfloat16 dot products (FEAT_BF16), the only non-x86 feature a path depends on.
    ("bf16", IsaCap::Native),
];

/// The SIMD width the crate's kernels are compiled for, ordered narrow to wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KernelTier {
    /// Baseline x86-64 (SSE2), or any other architecture.
    Generic,
    /// AVX2 with FMA.
    Avx2,
    /// AVX-512F with FMA.
    Avx512,
}

impl KernelTier {
    /// "generic", "avx2" or "avx512".
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Generic => "generic",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
        }
    }
}

/// The CPU's usable features after the cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuFeatures {
    /// The cap in force.
    pub cap: IsaCap,
    /// Set if `FERROLLM_CPU_ISA` held a value `IsaCap::parse` refuses (the cap is then
    /// `Native`); Python start-up reports it as an error naming the variable.
    pub cap_error: Option<String>,
    /// The features present and under the cap, in `FEATURES` order.
    pub names: Vec<&'static str>,
    /// The widest kernels these features run (read on hot paths, so decided once).
    pub tier: KernelTier,
}

impl CpuFeatures {
    /// This process's features, detected on first use.
    pub fn get() -> &'static CpuFeatures {
        static FEATURES_ONCE: OnceLock<CpuFeatures> = OnceLock::new();
        FEATURES_ONCE.get_or_init(|| {
            let (cap, cap_error) = match IsaCap::parse(&std::env::var(ISA_ENV).unwrap_or_default())
            {
                Ok(cap) => (cap, None),
                Err(e) => (IsaCap::Native, Some(e)),
            };
            Self::from_detected(cap, cap_error, detect)
        })
    }

    /// Everything this CPU has, ignoring `FERROLLM_CPU_ISA` (tests run every variant with it).
    pub fn uncapped() -> CpuFeatures {
        Self::from_detected(IsaCap::Native, None, detect)
    }

    /// The features `present` reports, kept where `cap` allows (for tests: any CPU).
    pub fn from_detected(
        cap: IsaCap,
        cap_error: Option<String>,
        present: impl Fn(&str) -> bool,
    ) -> Self {
        let allowed = |tier: IsaCap| match cap {
            IsaCap::Native => true,
            IsaCap::Avx2 => tier == IsaCap::Avx2,
            IsaCap::Baseline => false,
        };
        let names = FEATURES
            .iter()
            .filter(|(name, tier)| allowed(*tier) && present(name))
            .map(|(name, _)| *name)
            .collect::<Vec<_>>();
        let has = |name: &str| names.contains(&name);
        let tier = if has("fma") && has("avx512f") {
            KernelTier::Avx512
        } else if has("fma") && has("avx2") {
            KernelTier::Avx2
        } else {
            KernelTier::Generic
        };
        Self {
            cap,
            cap_error,
            names,
            tier,
        }
    }

    /// Whether feature `name` (a `/proc/cpuinfo` name) is present and allowed.
    pub fn has(&self, name: &str) -> bool {
        self.names.contains(&name)
    }
}

/// Whether the CPU running this reports `name` (false for names of other architectures).
fn detect(name: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match name {
            "avx2" => is_x86_feature_detected!("avx2"),
            "fma" => is_x86_feature_detected!("fma"),
            "f16c" => is_x86_feature_detected!("f16c"),
            "avx_vnni" => is_x86_feature_detected!("avxvnni"),
            "avx_ne_convert" => is_x86_feature_detected!("avxneconvert"),
            "avx512f" => is_x86_feature_detected!("avx512f"),
            "avx512bw" => is_x86_feature_detected!("avx512bw"),
            "avx512vl" => is_x86_feature_detected!("avx512vl"),
            "avx512dq" => is_x86_feature_detected!("avx512dq"),
            "avx512_vnni" => is_x86_feature_detected!("avx512vnni"),
            "avx512_bf16" => is_x86_feature_detected!("avx512bf16"),
            "amx_tile" | "amx_bf16" | "amx_int8" => amx(name),
            _ => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        name == "bf16" && std::arch::is_aarch64_feature_detected!("bf16")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = name;
        false
    }
}

/// AMX bits of CPUID leaf 7 (the `amx-*` detection macros are not stable Rust). Whether the
/// OS lets a process use the tiles is the library's (oneDNN's) business; this says the CPU has
/// them, as `/proc/cpuinfo` does.
#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)] // `__cpuid` is safe from Rust 1.87 on; kept for older toolchains
fn amx(name: &str) -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is read only if leaf 0 says it exists.
    let max_leaf = unsafe { __cpuid(0) }.eax;
    if max_leaf < 7 {
        return false;
    }
    // SAFETY: as above.
    let edx = unsafe { __cpuid_count(7, 0) }.edx;
    let bit = match name {
        "amx_bf16" => 22,
        "amx_tile" => 24,
        _ => 25, // amx_int8
    };
    edx & (1 << bit) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(_: &str) -> bool {
        true
    }

    #[test]
    fn caps_parse_and_round_trip() {
        for cap in [IsaCap::Native, IsaCap::Avx2, IsaCap::Baseline] {
            assert_eq!(IsaCap::parse(cap.as_str()), Ok(cap));
        }
        assert_eq!(IsaCap::parse(" AVX2 "), Ok(IsaCap::Avx2));
        assert_eq!(IsaCap::parse(""), Ok(IsaCap::Native));
        let err = IsaCap::parse("avx1024").unwrap_err();
        assert!(
            err.contains("FERROLLM_CPU_ISA") && err.contains("avx1024"),
            "{err}"
        );
    }

    #[test]
    fn the_avx2_cap_keeps_only_what_an_avx2_cpu_has() {
        let f = CpuFeatures::from_detected(IsaCap::Avx2, None, all);
        assert_eq!(f.names, ["avx2", "fma", "f16c"]);
        assert_eq!(f.tier, KernelTier::Avx2);
        let none = CpuFeatures::from_detected(IsaCap::Baseline, None, all);
        assert!(none.names.is_empty());
        assert_eq!(none.tier, KernelTier::Generic);
        let native = CpuFeatures::from_detected(IsaCap::Native, None, all);
        assert_eq!(native.names.len(), FEATURES.len());
        assert!(native.has("bf16") && !f.has("bf16"));
        assert_eq!(native.tier, KernelTier::Avx512);
    }

    #[test]
    fn a_feature_the_cpu_lacks_is_never_reported() {
        let f = CpuFeatures::from_detected(IsaCap::Native, None, |n| n == "avx2");
        assert_eq!(f.names, ["avx2"]);
        // AVX2 without FMA: the kernels stay portable (they are built for both together).
        assert_eq!(f.tier, KernelTier::Generic);
    }

    #[test]
    fn detection_matches_the_standard_library() {
        let f = CpuFeatures::from_detected(IsaCap::Native, None, detect);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(f.has("avx2"), is_x86_feature_detected!("avx2"));
            assert_eq!(f.has("avx512f"), is_x86_feature_detected!("avx512f"));
        }
        assert!(!f.has("no_such_feature"));
    }
}
