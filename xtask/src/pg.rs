//! A Postgres server for tests, demos and benchmarks, in this order:
//!
//! 1. `DATABASE_URL` when set;
//! 2. a container through testcontainers when a Docker engine answers
//!    (xtask re-runs itself with its `docker` feature to get it);
//! 3. a throwaway cluster started from the local PostgreSQL binaries in a
//!    temporary directory on a free port.
//!
//! Containers and clusters are stopped and removed on drop (also after a
//! failure or Ctrl-C, which xtask catches).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Settings for a throwaway cluster.
#[derive(Debug, Clone, Copy)]
pub struct ClusterOptions {
    /// Keep Postgres' default durability (fsync, synchronous_commit). Tests
    /// turn it off for speed; benchmarks keep it.
    pub durable: bool,
    /// Load pg_stat_statements (with planning times), for the bench's
    /// profile of where a job's time goes. Only a throwaway cluster from
    /// the local binaries can; the other servers ignore it.
    pub statements: bool,
}

/// A running server and how to reach it.
pub struct Postgres {
    /// A connection URL for the `postgres` database.
    pub url: String,
    /// Whether the server accepts TLS (`sslmode=require`): the throwaway
    /// cluster does, with a self-signed certificate, when `openssl` is
    /// installed.
    pub tls: bool,
    /// Human-readable origin, for logs.
    pub origin: String,
    /// Held so that the throwaway cluster is stopped and removed on drop.
    _cluster: Option<Cluster>,
    /// Held so that the container is stopped and removed on drop.
    #[cfg(feature = "docker")]
    _container: Option<testcontainers::ContainerAsync<testcontainers::GenericImage>>,
}

/// Whether a Docker engine answers (not just the client being installed).
pub fn docker_answers() -> bool {
    Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Whether xtask should re-run itself with the `docker` feature: a Docker
/// engine answers, no `DATABASE_URL` is set, and this build lacks the
/// feature.
pub fn wants_docker_build() -> bool {
    !cfg!(feature = "docker")
        && std::env::var("DATABASE_URL").map_or(true, |u| u.is_empty())
        && std::env::var_os("QUEUE_XTASK_NO_DOCKER").is_none()
        && docker_answers()
}

impl Postgres {
    /// A throwaway cluster from the local binaries, whatever DATABASE_URL
    /// or Docker offer: one this process may stop and start.
    pub fn start_local(options: ClusterOptions) -> Result<Postgres> {
        let cluster = Cluster::start(options)?;
        Ok(Postgres {
            url: cluster.url(),
            tls: cluster.tls,
            origin: format!("throwaway cluster on port {}", cluster.port),
            _cluster: Some(cluster),
            #[cfg(feature = "docker")]
            _container: None,
        })
    }

    /// Stops the server (a cluster of this process only).
    pub fn stop_server(&self) -> Result<()> {
        self._cluster
            .as_ref()
            .context("only a throwaway cluster of this process can be stopped")?
            .stop_server()
    }

    /// The server's log so far (a cluster of this process only).
    pub fn server_log(&self) -> Result<String> {
        let cluster = self
            ._cluster
            .as_ref()
            .context("only a throwaway cluster of this process has a log here")?;
        let path = cluster.dir.path().join("server.log");
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// Starts the stopped server again.
    pub fn start_server(&self) -> Result<()> {
        self._cluster
            .as_ref()
            .context("only a throwaway cluster of this process can be started")?
            .start_server()
    }

    /// Uses `DATABASE_URL`, or starts a throwaway cluster.
    pub async fn start(options: ClusterOptions) -> Result<Postgres> {
        if let Ok(url) = std::env::var("DATABASE_URL") {
            if !url.is_empty() {
                return Ok(Postgres {
                    url,
                    tls: false,
                    origin: "DATABASE_URL".into(),
                    _cluster: None,
                    #[cfg(feature = "docker")]
                    _container: None,
                });
            }
        }
        #[cfg(feature = "docker")]
        if docker_answers() {
            return container::start(options).await;
        }
        let cluster = Cluster::start(options)?;
        Ok(Postgres {
            url: cluster.url(),
            tls: cluster.tls,
            origin: format!(
                "throwaway cluster (PostgreSQL {}) on port {} in {}",
                cluster.version,
                cluster.port,
                cluster.dir.path().display()
            ),
            _cluster: Some(cluster),
            #[cfg(feature = "docker")]
            _container: None,
        })
    }
}

struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    version: String,
    /// The non-root user the server runs as, when xtask runs as root.
    run_as: Option<String>,
    /// Whether the server was given a certificate and serves TLS.
    tls: bool,
    /// The server's `-o` options, to start it again the same way.
    server_options: String,
}

/// Finds the directory holding `initdb` and `pg_ctl`: on `PATH`, or the
/// newest `/usr/lib/postgresql/*/bin`.
fn find_binaries() -> Result<PathBuf> {
    let initdb = find_tool("initdb")?;
    let dir = initdb
        .parent()
        .map(|p| p.to_path_buf())
        .context("initdb has no parent directory")?;
    if dir.join("pg_ctl").is_file() {
        Ok(dir)
    } else {
        bail!("found {} but no pg_ctl beside it", initdb.display())
    }
}

/// Finds a PostgreSQL program: on `PATH` (symlinks resolved, so that the
/// server's sibling programs are found too), or in the newest
/// `/usr/lib/postgresql/*/bin`.
pub fn find_tool(name: &str) -> Result<PathBuf> {
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                let resolved = std::fs::canonicalize(&candidate).unwrap_or(candidate);
                // Debian's pg_wrapper picks a cluster of its own; skip it for
                // the versioned binaries below.
                if !resolved.ends_with("pg_wrapper") {
                    return Ok(resolved);
                }
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let tool = entry.path().join("bin").join(name);
            tool.is_file().then_some((version, tool))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, tool)) => Ok(tool),
        None => bail!(
            "no PostgreSQL program `{name}` found (on PATH or under /usr/lib/postgresql/*/bin), \
             and DATABASE_URL is not set. Install the server with `apt-get install -y postgresql` \
             or point DATABASE_URL at a server"
        ),
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn user_exists(name: &str) -> bool {
    Command::new("id")
        .arg(name)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

impl Cluster {
    fn start(options: ClusterOptions) -> Result<Cluster> {
        let bin = find_binaries()?;
        let run_as = if is_root() {
            // Postgres refuses to run as root.
            let user = ["postgres", "nobody"]
                .into_iter()
                .find(|u| user_exists(u))
                .context("running as root, and neither a `postgres` nor a `nobody` user exists to run the server as")?;
            Some(user.to_owned())
        } else {
            None
        };
        // Removed when the cluster is dropped (after its server stops).
        let base = tempfile::Builder::new()
            .prefix(&format!("queue-pg-{}-", std::process::id()))
            .tempdir()
            .context("creating the cluster's directory")?;
        let port = free_port()?;
        let version = Command::new(bin.join("pg_ctl"))
            .arg("--version")
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .nth(2)
                    .unwrap_or("?")
                    .to_owned()
            })
            .unwrap_or_else(|_| "?".into());
        let mut cluster = Cluster {
            bin,
            dir: base,
            port,
            version,
            run_as,
            tls: false,
            server_options: String::new(),
        };
        if let Some(user) = &cluster.run_as {
            let status = Command::new("chown")
                .args(["-R", user])
                .arg(cluster.dir.path())
                .status()
                .context("running chown")?;
            if !status.success() {
                bail!(
                    "could not hand {} to user {user}",
                    cluster.dir.path().display()
                );
            }
        }
        cluster.init_and_start(options)?;
        Ok(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(path);
                c
            }
            None => Command::new(path),
        }
    }

    /// Gives the server a self-signed certificate for TLS, if `openssl` is
    /// installed; returns whether it did.
    fn make_certificate(&self) -> Result<bool> {
        let (crt, key) = (
            self.data().join("server.crt"),
            self.data().join("server.key"),
        );
        let made = Command::new("openssl")
            .args([
                "req",
                "-new",
                "-x509",
                "-days",
                "2",
                "-nodes",
                "-subj",
                "/CN=localhost",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&crt)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!(
                "xtask: no openssl, so the throwaway cluster serves no TLS (the TLS test says so)"
            );
            return Ok(false);
        }
        // Postgres reads its key only if the server's user owns it, alone.
        let mut steps = vec![Command::new("chmod")];
        steps[0].arg("600").arg(&key);
        if let Some(user) = &self.run_as {
            let mut chown = Command::new("chown");
            chown.arg(user).arg(&key).arg(&crt);
            steps.push(chown);
        }
        for mut step in steps {
            if !step
                .status()
                .context("preparing the certificate")?
                .success()
            {
                bail!("could not hand the certificate to the server's user");
            }
        }
        Ok(true)
    }

    fn init_and_start(&mut self, options: ClusterOptions) -> Result<()> {
        let out = self
            .command("initdb")
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(self.data())
            .output()
            .context("running initdb")?;
        if !out.status.success() {
            bail!(
                "initdb failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.tls = self.make_certificate()?;
        let mut server_options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300 -c shared_buffers=256MB",
            self.port,
            self.dir.path().display()
        );
        if self.tls {
            // Relative to the data directory.
            server_options
                .push_str(" -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key");
        }
        if !options.durable {
            server_options
                .push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
        }
        if options.statements {
            server_options.push_str(
                " -c shared_preload_libraries=pg_stat_statements \
                 -c pg_stat_statements.track_planning=on",
            );
        }
        self.server_options = server_options;
        self.start_server()
    }

    /// Starts the initialised server (again).
    fn start_server(&self) -> Result<()> {
        let log = self.dir.path().join("server.log");
        let out = self
            .command("pg_ctl")
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(self.data())
            .arg("-l")
            .arg(&log)
            .args(["-o", &self.server_options])
            .stdout(Stdio::null())
            .output()
            .context("running pg_ctl start")?;
        if !out.status.success() {
            let server_log = std::fs::read_to_string(&log).unwrap_or_default();
            bail!(
                "pg_ctl start failed:\n{}\nserver log:\n{server_log}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Stops the server, dropping every connection (`-m fast`).
    fn stop_server(&self) -> Result<()> {
        let out = self
            .command("pg_ctl")
            .args(["stop", "-m", "fast", "-w", "-t", "60", "-D"])
            .arg(self.data())
            .stdout(Stdio::null())
            .output()
            .context("running pg_ctl stop")?;
        if !out.status.success() {
            bail!(
                "pg_ctl stop failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(self.data())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[cfg(feature = "docker")]
mod container {
    use anyhow::{Context, Result};
    use testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{GenericImage, ImageExt};

    use super::{ClusterOptions, Postgres};

    /// Postgres 16 in a container, on a random host port.
    pub async fn start(options: ClusterOptions) -> Result<Postgres> {
        let (container, port) = {
            let mut image = GenericImage::new("postgres", "16-alpine")
                .with_exposed_port(5432.tcp())
                .with_wait_for(WaitFor::message_on_stderr(
                    "database system is ready to accept connections",
                ))
                .with_env_var("POSTGRES_HOST_AUTH_METHOD", "trust");
            if !options.durable {
                image = image.with_cmd([
                    "postgres",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "max_connections=300",
                ]);
            } else {
                image = image.with_cmd(["postgres", "-c", "max_connections=300"]);
            }
            let container = image
                .start()
                .await
                .context("starting the Postgres container")?;
            let port = container
                .get_host_port_ipv4(5432)
                .await
                .context("reading the container's port")?;
            (container, port)
        };
        Ok(Postgres {
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            tls: false,
            origin: format!("a testcontainers container (postgres:16-alpine) on port {port}"),
            _cluster: None,
            _container: Some(container),
        })
    }
}
