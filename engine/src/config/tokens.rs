//! [`TokenBook`]: the API tokens in force (engine.yaml's `auth`) and their
//! generation — it grows at each reload that changed them, so the web layer
//! knows to rebuild its table. Replaced whole, read whole: a reader never
//! sees one reload's tokens with another's generation.

use std::sync::{Arc, RwLock};

use super::AuthConfig;

/// The tokens in force, and how many times a reload replaced them.
pub(crate) struct TokenBook {
    now: RwLock<(u64, Arc<AuthConfig>)>,
}

impl TokenBook {
    /// The tokens engine.yaml had at start: generation 0.
    pub(crate) fn new(auth: AuthConfig) -> TokenBook {
        TokenBook { now: RwLock::new((0, Arc::new(auth))) }
    }

    /// The tokens in force and their generation.
    pub(crate) fn get(&self) -> (u64, Arc<AuthConfig>) {
        let g = self.now.read().unwrap_or_else(|e| e.into_inner());
        (g.0, g.1.clone())
    }

    /// Put `auth` in force: the next generation.
    pub(crate) fn replace(&self, auth: AuthConfig) {
        let mut g = self.now.write().unwrap_or_else(|e| e.into_inner());
        *g = (g.0 + 1, Arc::new(auth));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_replacement_is_the_next_generation() {
        let b = TokenBook::new(AuthConfig::default());
        assert_eq!(b.get().0, 0);
        b.replace(AuthConfig::default());
        b.replace(AuthConfig::default());
        assert_eq!(b.get().0, 2);
    }
}
