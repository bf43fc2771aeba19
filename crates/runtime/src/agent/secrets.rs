//! A hook's secrets: the value behind a secret pointer, handed over only to the destinations
//! it is bound to.

use durafiber_store::access;

use super::{Agent, Ctx};
use crate::{
    error::AgentError,
    secret::{Secret, SecretRefusal},
};

impl<A: Agent> Ctx<A> {
    /// The value behind a secret pointer, to be sent to `url`: handed over only when `url`'s
    /// scheme, host and port are among the secret's destinations
    /// (`DURAFIBER_SECRET_<NAME>_HOSTS`, or [`crate::Secrets::bind`]). Anything else is
    /// `AgentError::SecretRefused`, and the run's event log says where it would have gone:
    /// a run whose input names the URL cannot send the key to a server of its caller's.
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, Ctx, Secret};
    /// # async fn pay<A: Agent>(ctx: &Ctx<A>, url: &str) -> Result<(), AgentError> {
    /// let key = ctx.secret_for(&Secret::named("stripe_key"), url)?; // only to api.stripe.com
    /// # Ok(()) }
    /// ```
    pub fn secret_for(&self, secret: &Secret, url: &str) -> Result<String, AgentError> {
        let shared = &self.raw.shared;
        shared.obs.secrets.resolve_for(secret, url).map_err(|refusal| {
            let destination = match refusal {
                SecretRefusal::Unknown => "(not configured)".to_string(),
                SecretRefusal::Destination(d) => d,
            };
            let run_id = &self.raw.cell.run_id;
            tracing::warn!(%run_id, secret = %secret.secret, destination, "a secret was refused for a destination it is not bound to");
            let detail = format!("{} to {destination}", secret.secret);
            shared.event(run_id, "secret_refused", detail.clone());
            // Into the audit trail too, beside what callers asked for: by the run itself.
            let (store, run, now) = (shared.store.clone(), run_id.clone(), shared.now());
            shared.life.spawn_tracked(async move {
                let actor = format!("run:{run}");
                if let Err(e) = access::append(&store, &actor, "secret_refused", Some(&run), &detail, now).await {
                    tracing::error!(run_id = %run, error = %e, "could not audit a refused secret");
                }
            });
            AgentError::SecretRefused { name: secret.secret.clone(), destination }
        })
    }

    /// The value behind a secret pointer, resolved now and never stored — for a use inside
    /// the process (signing, say). A value sent anywhere goes through [`Ctx::secret_for`].
    pub fn secret(&self, secret: &Secret) -> Result<String, AgentError> {
        self.raw
            .shared
            .obs
            .secrets
            .resolve(secret)
            .ok_or_else(|| AgentError::fail(format!("secret {} is not configured", secret.secret)))
    }
}
