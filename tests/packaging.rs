//! The packaging (container recipe, Kubernetes manifests, systemd unit), checked with the
//! real tools:
//!
//! - the Dockerfile with hadolint;
//! - deploy/kubernetes as kustomize renders it (kubectl's built-in kustomize): core kinds
//!   with kubernetes-validate (strict, two cluster versions), ServiceMonitor and
//!   PrometheusRule with the Prometheus Operator models (scripts/k8s-validate), the rules
//!   inside the PrometheusRules with promtool;
//! - deploy/kubernetes/generated/ is what scripts/gen-k8s.py makes of alerts/ and dashboards/;
//! - the shipped config passes `lockprobe check-config`;
//! - the systemd unit with `systemd-analyze verify` and `systemd-analyze security`;
//! - the pieces agree: ports, paths, names, labels, keys.
//!
//! Each tool is first handed a broken input and must reject it (a canary), so a tool that
//! stopped checking fails here rather than passing everything.
//!
//! Tools: `bash scripts/install-test-deps.sh` installs promtool and systemd-analyze (Debian)
//! and runs scripts/setup-packaging-tools.sh for the pinned rest (.test-tools/venv and
//! scripts/k8s-validate/node_modules).

#[path = "support/pki.rs"]
mod pki;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The cluster versions the manifests are validated against: the oldest we claim, the newest
/// the pinned kubernetes-validate knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];
const MONITORING_GROUP: &str = "monitoring.coreos.com/";
const CONFIG_PATH: &str = "/etc/lockprobe/lockprobe.toml";
/// Where the StatefulSet mounts web.yml (`serve --web.config.file`).
const WEB_CONFIG_PATH: &str = "/etc/lockprobe-web/web.yml";
/// Where it mounts the TLS Secret (tls.crt, tls.key) web.yml names.
const TLS_DIR: &str = "/etc/lockprobe-tls";
const STATE_DIR: &str = "/var/lib/lockprobe";
const INSTALL_HINT: &str =
    "run `bash scripts/install-test-deps.sh` (scripts/setup-packaging-tools.sh for the pinned tools)";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// A tool of the pinned Python environment.
fn venv_tool(name: &str) -> PathBuf {
    let path = root().join(".test-tools/venv/bin").join(name);
    assert!(path.exists(), "{} is missing: {INSTALL_HINT}", path.display());
    path
}

/// Runs a command to completion; a command that cannot start is a missing tool.
fn run(command: &mut Command) -> Output {
    command.output().unwrap_or_else(|e| panic!("cannot run {command:?} ({e}): {INSTALL_HINT}"))
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn assert_success(what: &str, out: &Output) {
    assert!(out.status.success(), "{what} failed ({}):\n{}", out.status, text(out));
}

fn assert_rejected(what: &str, out: &Output, expected: &str) {
    assert!(!out.status.success(), "canary: {what} accepted a broken input:\n{}", text(out));
    assert!(text(out).contains(expected), "canary: {what} failed, but without naming {expected:?}:\n{}", text(out));
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("packaging-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// deploy/kubernetes as `kubectl kustomize` renders it (what `kubectl apply -k` would send).
fn render(dir: &Path) -> PathBuf {
    let out = run(Command::new(venv_tool("kubectl")).arg("kustomize").arg(root().join("deploy/kubernetes")));
    assert_success("kubectl kustomize deploy/kubernetes", &out);
    let path = dir.join("rendered.yaml");
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

/// scripts/k8s-validate/validate.mjs on `inputs`, with extra arguments.
fn k8s_validate(inputs: &[&Path], extra: &[&Path]) -> Output {
    let script = root().join("scripts/k8s-validate/validate.mjs");
    assert!(
        root().join("scripts/k8s-validate/node_modules/.lockprobe-installed").exists(),
        "scripts/k8s-validate/node_modules is missing: {INSTALL_HINT}"
    );
    run(Command::new("node").arg(script).args(inputs).args(extra))
}

/// The objects of a YAML file as JSON, by the validator's YAML parser (no validation).
fn objects_of(file: &Path) -> Vec<Value> {
    let dir = tempdir();
    let json = dir.path().join("objects.json");
    let out = k8s_validate(&[file], &[Path::new("--no-check"), Path::new("--json"), &json]);
    assert_success("validate.mjs --no-check --json", &out);
    serde_json::from_str::<Vec<Value>>(&read(&json)).unwrap()
}

/// The rendered objects as JSON.
fn rendered_objects() -> Vec<Value> {
    let dir = tempdir();
    objects_of(&render(dir.path()))
}

fn find<'a>(objects: &'a [Value], kind: &str, name_prefix: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"].as_str().is_some_and(|n| n.starts_with(name_prefix)))
        .unwrap_or_else(|| panic!("no {kind} named {name_prefix}* in the rendered manifests"))
}

fn str_of(value: &Value) -> &str {
    value.as_str().unwrap_or_else(|| panic!("expected a string, found {value}"))
}

/// deploy/kubernetes/lockprobe.toml, which the ConfigMap and the systemd install both use.
fn config() -> toml::Table {
    read(root().join("deploy/kubernetes/lockprobe.toml")).parse().unwrap()
}

fn listen_port(config: &toml::Table) -> u16 {
    let listen = config["listen"].as_str().unwrap();
    listen.rsplit(':').next().unwrap().parse().unwrap()
}

fn api_key_envs(config: &toml::Table) -> BTreeSet<String> {
    let targets = config["targets"].as_array().unwrap();
    targets
        .iter()
        .map(|t| t.get("api_key_env").and_then(|v| v.as_str()).unwrap_or("LOCKPROBE_LOCK_API_KEY").to_string())
        .collect()
}

#[test]
fn container_recipe_passes_hadolint() {
    let hadolint = venv_tool("hadolint");
    let config = root().join("deploy/container/hadolint.yaml");
    let lint = |file: &Path| run(Command::new(&hadolint).arg("--no-color").arg("--config").arg(&config).arg(file));

    let dir = tempdir();
    let broken = dir.path().join("Dockerfile");
    std::fs::write(&broken, "FROM quay.io/debian\nRUN apt-get update && apt-get install -y curl\n").unwrap();
    assert_rejected("hadolint", &lint(&broken), "DL3026");

    let out = lint(&root().join("deploy/container/Dockerfile"));
    assert_success("hadolint deploy/container/Dockerfile", &out);
    assert!(text(&out).trim().is_empty(), "hadolint findings:\n{}", text(&out));
}

#[test]
fn container_recipe_agrees_with_the_config() {
    let dockerfile = read(root().join("deploy/container/Dockerfile"));
    let instructions: Vec<&str> = dockerfile.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
    let has = |line: &str| instructions.iter().any(|l| l.trim() == line);
    let config = config();
    assert!(has(&format!("EXPOSE {}", listen_port(&config))), "EXPOSE is not the config's listen port");
    assert!(has(&format!("VOLUME [\"{STATE_DIR}\"]")), "the state directory is not a volume");
    assert!(has(&format!("CMD [\"serve\", \"--config\", \"{CONFIG_PATH}\"]")), "CMD does not serve {CONFIG_PATH}");
    assert!(has("ENTRYPOINT [\"/usr/local/bin/lockprobe\"]"));
    assert!(has("USER 65532:65532"), "the image must run as the numeric non-root user");
    assert_eq!(instructions.iter().filter(|l| l.starts_with("FROM ")).count(), 2, "a build and a runtime stage");
    let state_file = Path::new(config["state_file"].as_str().unwrap());
    assert_eq!(state_file.parent(), Some(Path::new(STATE_DIR)), "state_file must be on the state volume");
}

#[test]
fn generated_manifests_are_current() {
    let out = run(Command::new("python3").arg(root().join("scripts/gen-k8s.py")).arg("--check"));
    assert_success("python3 scripts/gen-k8s.py --check (regenerate with `python3 scripts/gen-k8s.py`)", &out);

    // Canary: in a copy of the sources, an edited alert file makes the check fail.
    let dir = tempdir();
    let copy = dir.path();
    for sub in ["scripts", "alerts", "dashboards", "deploy/kubernetes/generated"] {
        std::fs::create_dir_all(copy.join(sub)).unwrap();
    }
    let copies = [
        "scripts/gen-k8s.py",
        "alerts/lockprobe.rules.yml",
        "alerts/lockprobe-monitor.rules.yml",
        "dashboards/lockprobe.json",
        "dashboards/lockprobe-monitor.json",
        "deploy/kubernetes/generated/prometheusrules.yaml",
        "deploy/kubernetes/generated/dashboards.yaml",
    ];
    for file in copies {
        std::fs::copy(root().join(file), copy.join(file)).unwrap();
    }
    let check = || run(Command::new("python3").arg(copy.join("scripts/gen-k8s.py")).arg("--check"));
    assert_success("gen-k8s.py --check on an unchanged copy", &check());
    let alerts = copy.join("alerts/lockprobe-monitor.rules.yml");
    std::fs::write(&alerts, read(&alerts).replace("for: 15m", "for: 20m")).unwrap();
    assert_rejected("gen-k8s.py --check", &check(), "prometheusrules.yaml");
}

#[test]
fn core_kinds_pass_kubernetes_validate() {
    let kubernetes_validate = venv_tool("kubernetes-validate");
    let validate = |version: &str, files: &[&Path]| {
        run(Command::new(&kubernetes_validate).args(["--strict", "-k", version]).args(files))
    };
    let dir = tempdir();

    let objects = rendered_objects();
    let rendered = render(dir.path());
    let secret = root().join("deploy/kubernetes/secret.example.yaml");
    let web = root().join("deploy/kubernetes/web-config.example.yaml");
    let core: BTreeSet<String> = objects
        .iter()
        .filter(|o| !str_of(&o["apiVersion"]).starts_with(MONITORING_GROUP))
        .map(|o| format!("{}/{}", str_of(&o["kind"]).to_lowercase(), str_of(&o["metadata"]["name"])))
        .chain(
            ["secret/lockprobe-api-keys", "secret/lockprobe-web-config", "secret/lockprobe-scrape-auth"]
                .map(String::from),
        )
        .collect();
    for version in KUBERNETES_VERSIONS {
        let out = validate(version, &[&rendered, &secret, &web]);
        assert_success(&format!("kubernetes-validate --strict -k {version}"), &out);
        let report = text(&out);
        for object in &core {
            assert!(
                report.contains(&format!("passed for resource {object} against")),
                "kubernetes-validate {version} did not validate {object}:\n{report}"
            );
        }
        // It only warns about kinds it has no schema for: those must be the operator's.
        for line in report.lines().filter(|l| l.contains("Couldn't find schema")) {
            assert!(line.contains("api version monitoring.coreos.com/v1"), "a core kind went unvalidated: {line}");
        }
    }

    // Canaries (after the real check, since they are made from the rendered objects): an
    // unknown field and a wrongly typed one, each in an otherwise valid object.
    let mut unknown = find(&objects, "StatefulSet", "lockprobe").clone();
    unknown["spec"]["template"]["spec"]["containers"][0]["imagee"] = "lockprobe:dev".into();
    let mut mistyped = find(&objects, "Service", "lockprobe").clone();
    mistyped["spec"]["ports"][0]["port"] = "ninety-four-sixty-four".into();
    for (name, object, expected) in
        [("unknown.json", unknown, "'imagee' was unexpected"), ("mistyped.json", mistyped, "is not of type")]
    {
        let path = dir.path().join(name);
        std::fs::write(&path, object.to_string()).unwrap();
        assert_rejected("kubernetes-validate", &validate(KUBERNETES_VERSIONS[1], &[&path]), expected);
    }
}

#[test]
fn prometheus_operator_kinds_pass_their_models() {
    let dir = tempdir();
    // Canary: a misspelt field (the schemas alone would allow it), a bad duration, and a
    // kind the package has no model for.
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        r#"apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: misspelt}
spec:
  selector: {matchLabels: {app: x}}
  endpoints: [{port: http, intreval: 30s}]
---
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: bad-duration}
spec:
  groups: [{name: g, rules: [{alert: A, expr: up == 0, for: 5 minutes}]}]
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitorr
metadata: {name: no-model}
"#,
    )
    .unwrap();
    // One run for both (the type check takes seconds); each object gets its own verdict.
    let out = k8s_validate(&[&render(dir.path()), &broken], &[]);
    let report = text(&out);
    assert!(!out.status.success(), "validate.mjs passed a broken file:\n{report}");
    for expected in [
        "FAIL ServiceMonitor/misspelt in broken.yaml: type: Object literal may only specify known properties, and '\"intreval\"' does not exist",
        "FAIL PrometheusRule/bad-duration in broken.yaml: schema: data/spec/groups/0/rules/0/for must match pattern",
        "FAIL ServiceMonitorr/no-model in broken.yaml: no model",
    ] {
        assert!(report.contains(expected), "canary: validate.mjs did not report {expected:?}:\n{report}");
    }
    assert!(!report.contains("in rendered.yaml:"), "the rendered manifests failed:\n{report}");
    for object in
        ["ServiceMonitor/lockprobe", "PrometheusRule/lockprobe-rules", "PrometheusRule/lockprobe-monitor-rules"]
    {
        assert!(report.contains(&format!("ok {object} in rendered.yaml (")), "{object} was not validated:\n{report}");
    }
}

/// The number of rules promtool finds in `file`, which must pass `promtool check rules`.
fn promtool_rule_count(file: &Path) -> usize {
    let out = run(Command::new("promtool").args(["check", "rules"]).arg(file));
    assert_success(&format!("promtool check rules {}", file.display()), &out);
    let report = text(&out);
    let count =
        report.lines().find_map(|l| l.trim().strip_prefix("SUCCESS: ")?.strip_suffix(" rules found")?.parse().ok());
    count.unwrap_or_else(|| panic!("no rule count in promtool's report:\n{report}"))
}

#[test]
fn prometheus_rules_pass_promtool_and_match_their_sources() {
    let dir = tempdir();
    let rules = dir.path().join("rules");
    let out = k8s_validate(&[&render(dir.path())], &[Path::new("--no-check"), Path::new("--rules-dir"), &rules]);
    assert_success("validate.mjs --rules-dir", &out);

    // Canary: promtool rejects a rule file with a broken expression.
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, r#"{"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "rate(up[5m]"}]}]}"#)
        .unwrap();
    assert_rejected(
        "promtool check rules",
        &run(Command::new("promtool").args(["check", "rules"]).arg(&broken)),
        "FAILED",
    );

    let objects = rendered_objects();
    let generated: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "PrometheusRule").collect();
    let sources: BTreeSet<String> = std::fs::read_dir(root().join("alerts"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".rules.yml"))
        .map(|n| format!("alerts/{n}"))
        .collect();
    let covered: BTreeSet<String> =
        generated.iter().map(|o| str_of(&o["metadata"]["annotations"]["lockprobe/source"]).to_string()).collect();
    assert_eq!(covered, sources, "one PrometheusRule per alerts/*.rules.yml");
    for rule in generated {
        let name = str_of(&rule["metadata"]["name"]);
        let source = root().join(str_of(&rule["metadata"]["annotations"]["lockprobe/source"]));
        assert_eq!(
            promtool_rule_count(&rules.join(format!("{name}.json"))),
            promtool_rule_count(&source),
            "PrometheusRule {name} does not hold every rule of {}",
            source.display()
        );
    }
}

#[test]
fn kubernetes_objects_agree_with_each_other_and_the_config() {
    let objects = rendered_objects();
    let config = config();
    let port = listen_port(&config);

    // The StatefulSet runs `serve` on the ConfigMap, non-root, read-only, with probes, in
    // two replicas of one config (they share the pool through claims), each with its own
    // state volume.
    let deployment = find(&objects, "StatefulSet", "lockprobe");
    let pod = &deployment["spec"]["template"]["spec"];
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(deployment["spec"]["replicas"], 2, "redundancy: two replicas of one config");
    let per_replica = config["targets"].as_array().unwrap().iter().all(|t| {
        let (pool, concurrency) = (t["pool_size"].as_integer().unwrap(), t["concurrency"].as_integer().unwrap());
        pool >= 7 * concurrency * 2
    });
    assert!(per_replica, "each target's pool has room for both replicas' concurrent cycles");
    let container = &pod["containers"][0];
    assert_eq!(
        container["args"],
        serde_json::json!(["serve", "--config", CONFIG_PATH, "--web.config.file", WEB_CONFIG_PATH])
    );
    assert_eq!(container["ports"][0]["name"], "http");
    assert_eq!(container["ports"][0]["containerPort"], port, "containerPort is not the config's listen port");
    // The kubelet's probes carry no credentials: only the paths basic authentication
    // leaves open, over the TLS the web configuration turns on.
    for (probe, path) in [("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(container[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"], "http", "{probe}");
        assert_eq!(container[probe]["httpGet"]["scheme"], "HTTPS", "{probe}");
    }
    for resource in ["requests", "limits"] {
        assert!(container["resources"][resource]["memory"].is_string(), "resources.{resource}.memory");
    }
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532, "the image's USER");
    assert_eq!(pod["automountServiceAccountToken"], false);
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));

    // Volumes: the config at /etc/lockprobe from the generated ConfigMap holding the file as
    // is; the state directory on the PVC.
    let mount = |path: &str| -> &Value {
        let mounts = container["volumeMounts"].as_array().unwrap();
        let name =
            &mounts.iter().find(|m| m["mountPath"] == path).unwrap_or_else(|| panic!("nothing mounted at {path}"))
                ["name"];
        pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == *name).unwrap()
    };
    let config_map = find(&objects, "ConfigMap", str_of(&mount("/etc/lockprobe")["configMap"]["name"]));
    assert_eq!(str_of(&config_map["data"]["lockprobe.toml"]), read(root().join("deploy/kubernetes/lockprobe.toml")));
    let state_file = Path::new(config["state_file"].as_str().unwrap());
    let state_dir = state_file.parent().unwrap().to_str().unwrap();
    let mounts = container["volumeMounts"].as_array().unwrap();
    let state_mount = mounts.iter().find(|m| m["mountPath"] == state_dir).expect("the state directory is mounted");
    let templates = deployment["spec"]["volumeClaimTemplates"].as_array().expect("volumeClaimTemplates");
    assert!(
        templates.iter().any(|t| t["metadata"]["name"] == state_mount["name"]),
        "the state directory is each replica's own claim"
    );

    // Keys: the Secret the pod reads holds every variable the config names.
    let secret = objects_of(&root().join("deploy/kubernetes/secret.example.yaml")).remove(0);
    assert_eq!(container["envFrom"][0]["secretRef"]["name"], secret["metadata"]["name"]);
    let keys: BTreeSet<String> = secret["stringData"].as_object().unwrap().keys().cloned().collect();
    assert!(api_key_envs(&config).is_subset(&keys), "secret.example.yaml lacks a key the config names: {keys:?}");
    assert!(
        secret["stringData"].as_object().unwrap().values().all(|v| str_of(v).starts_with("REPLACE-ME")),
        "the example Secret holds placeholders only"
    );

    // Service -> pods, ServiceMonitor -> Service; the job label is the Service's name, which
    // LockprobeDown expects.
    let service = find(&objects, "Service", "lockprobe");
    assert_eq!(service["metadata"]["name"], "lockprobe", "LockprobeDown looks for job=\"lockprobe\"");
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod_labels[key], value, "the Service does not select the pods ({key})");
    }
    assert_eq!(service["spec"]["ports"][0]["name"], "http");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "http");
    let monitor = find(&objects, "ServiceMonitor", "lockprobe");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &service["metadata"]["labels"][key], value,
            "the ServiceMonitor does not select the Service ({key})"
        );
    }
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "http");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");

    // The web configuration: web.yml from its Secret at the path `serve` is given, naming
    // the certificate where the TLS Secret is mounted; it loads (with test certificates
    // in place of the mounted ones); the ServiceMonitor scrapes over TLS trusting that
    // Secret's CA, as a user web.yml has, with the example's password.
    let web_objects = objects_of(&root().join("deploy/kubernetes/web-config.example.yaml"));
    let web_secret = web_objects.iter().find(|o| o["metadata"]["name"] == "lockprobe-web-config").unwrap();
    let (web_dir, web_file) = WEB_CONFIG_PATH.rsplit_once('/').unwrap();
    assert_eq!(mount(web_dir)["secret"]["secretName"], web_secret["metadata"]["name"]);
    let web_yml = str_of(&web_secret["stringData"][web_file]).to_owned();
    let tls_secret = str_of(&mount(TLS_DIR)["secret"]["secretName"]).to_owned();
    for file in ["tls.crt", "tls.key"] {
        assert!(web_yml.contains(&format!("{TLS_DIR}/{file}")), "web.yml does not name {TLS_DIR}/{file}:\n{web_yml}");
    }
    let pki = pki::Pki::generate();
    let loadable = web_yml
        .replace(&format!("{TLS_DIR}/tls.crt"), pki.server_cert.to_str().unwrap())
        .replace(&format!("{TLS_DIR}/tls.key"), pki.server_key.to_str().unwrap());
    let loadable = pki.write("web.yml", &loadable);
    assert_success(
        "lockprobe check-config --web.config.file (the example's web.yml)",
        &run(Command::new(env!("CARGO_BIN_EXE_lockprobe")).args(["check-config", "--web.config.file"]).arg(&loadable)),
    );
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["tlsConfig"]["ca"]["secret"]["name"], tls_secret.as_str());
    assert_eq!(endpoint["tlsConfig"]["serverName"], service["metadata"]["name"], "the certificate names the Service");
    let scrape = web_objects.iter().find(|o| o["metadata"]["name"] == "lockprobe-scrape-auth").unwrap();
    for field in ["username", "password"] {
        assert_eq!(endpoint["basicAuth"][field]["name"], scrape["metadata"]["name"], "{field}");
    }
    let user = str_of(&scrape["stringData"][str_of(&endpoint["basicAuth"]["username"]["key"])]);
    let password = str_of(&scrape["stringData"][str_of(&endpoint["basicAuth"]["password"]["key"])]);
    let users: serde_json::Map<String, Value> = web_yml
        .split_once("basic_auth_users:\n")
        .unwrap()
        .1
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains(": "))
        .map(|l| {
            let (name, hash) = l.trim().split_once(": ").unwrap();
            (name.to_owned(), Value::from(hash))
        })
        .collect();
    let hash = users.get(user).unwrap_or_else(|| panic!("web.yml has no user {user}: {users:?}"));
    assert!(bcrypt::verify(password, str_of(hash)).unwrap(), "the scrape password is not the one web.yml's hash is of");

    // Only Prometheus reaches the pods' HTTP port, and a drain takes one replica at a
    // time: both select exactly the StatefulSet's pods.
    let policy = find(&objects, "NetworkPolicy", "lockprobe");
    let budget = find(&objects, "PodDisruptionBudget", "lockprobe");
    for (kind, selector) in [("NetworkPolicy", &policy["spec"]["podSelector"]), ("PDB", &budget["spec"]["selector"])] {
        assert_eq!(&selector["matchLabels"], pod_labels, "the {kind} does not select the pods");
    }
    assert_eq!(policy["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    let ingress = policy["spec"]["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 1, "one rule: Prometheus");
    assert_eq!(ingress[0]["ports"], serde_json::json!([{"port": "http", "protocol": "TCP"}]));
    assert_eq!(ingress[0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"], "prometheus");
    assert_eq!(budget["spec"]["maxUnavailable"], 1, "two replicas: one stays through a drain");

    // Dashboards: one ConfigMap per dashboards/*.json, holding it byte for byte.
    for entry in std::fs::read_dir(root().join("dashboards")).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap();
        let stem = path.file_stem().unwrap().to_str().unwrap();
        let map = find(&objects, "ConfigMap", &format!("grafana-dashboard-{stem}"));
        assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1", "{file}: Grafana's sidecar label");
        assert_eq!(str_of(&map["data"][file]), read(&path), "{file} differs in its ConfigMap");
    }
}

/// `lockprobe check-config` on the shipped config, and on it with the commented `[monitor]`
/// example switched on.
#[test]
fn shipped_config_passes_check_config() {
    let check = |path: &Path| {
        run(Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .arg("check-config")
            .arg(path)
            .env("ROUTING_COSMOS_KEY", "cGxhY2Vob2xkZXItbm90LWEta2V5")
            .env("ORDERS_LOCK_API_KEY", "placeholder"))
    };
    let shipped = root().join("deploy/kubernetes/lockprobe.toml");
    assert_success("lockprobe check-config deploy/kubernetes/lockprobe.toml", &check(&shipped));

    let text = read(&shipped);
    let (before, rest) = text.split_once("# BEGIN monitor\n").expect("a `# BEGIN monitor` block");
    let (block, after) = rest.split_once("# END monitor\n").expect("an `# END monitor` line");
    let enabled: String = block.lines().map(|l| format!("{}\n", l.strip_prefix("# ").unwrap_or(l))).collect();
    assert!(enabled.contains("[monitor]"));
    let dir = tempdir();
    let with_monitor = dir.path().join("with-monitor.toml");
    std::fs::write(&with_monitor, format!("{before}{enabled}{after}")).unwrap();
    let checked = check(&with_monitor);
    assert_success("lockprobe check-config with the [monitor] example", &checked);
    let warned = String::from_utf8_lossy(&checked.stderr);
    assert!(!warned.contains("WARN"), "the shipped [monitor] example warns: {warned}");

    // Canary: a misspelt key is refused.
    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, text.replace("state_file =", "statefile =")).unwrap();
    assert_rejected("lockprobe check-config", &check(&broken), "statefile");
}

/// A filesystem root for `systemd-analyze --root`: the unit, the binary at its ExecStart
/// path, the commands it runs and the system units it depends on, all copied from this
/// machine, so the unit is verified as shipped.
fn systemd_root(dir: &Path, unit: &str) -> PathBuf {
    let system_units = Path::new("/usr/lib/systemd/system");
    assert!(system_units.join("sysinit.target").exists(), "systemd's units are missing: {INSTALL_HINT}");
    for sub in ["etc/systemd/system", "usr/lib/systemd", "usr/bin", "usr/local/bin"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    assert_success("cp -a", &run(Command::new("cp").arg("-a").arg(system_units).arg(dir.join("usr/lib/systemd"))));
    std::os::unix::fs::symlink("usr/bin", dir.join("bin")).unwrap();
    std::fs::copy("/usr/bin/kill", dir.join("usr/bin/kill")).unwrap();
    // A hard link where the filesystem allows (the debug binary is large), else a copy.
    let binary = dir.join("usr/local/bin/lockprobe");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_lockprobe"), &binary).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_lockprobe"), &binary).unwrap();
    }
    let path = dir.join("etc/systemd/system/lockprobe.service");
    std::fs::write(&path, unit).unwrap();
    path
}

#[test]
fn systemd_unit_verifies_and_is_hardened() {
    let unit = read(root().join("deploy/systemd/lockprobe.service"));
    let verify = |dir: &Path, unit: &str| {
        let path = systemd_root(dir, unit);
        run(Command::new("systemd-analyze").arg("verify").arg(format!("--root={}", dir.display())).arg(path))
    };
    // Exposure scale 0-10 (printed); 20 here means 2.0: "OK" is below 4.
    let security = |dir: &Path, unit: &str| {
        let path = systemd_root(dir, unit);
        run(Command::new("systemd-analyze")
            .args(["security", "--offline=yes", "--threshold=20"])
            .arg(format!("--root={}", dir.display()))
            .arg(path))
    };

    let dir = tempdir();
    let out = verify(dir.path(), &unit);
    assert!(out.status.success() && text(&out).trim().is_empty(), "systemd-analyze verify:\n{}", text(&out));
    let dir = tempdir();
    let out = security(dir.path(), &unit);
    assert_success("systemd-analyze security --threshold=20", &out);

    // Canaries (after the real checks). verify only warns (exit 0) about unknown keys and
    // bad values, hence "any output fails" above; security fails an unhardened unit.
    let canary = tempdir();
    let out = verify(canary.path(), &unit.replacen("[Service]\n", "[Service]\nProtectSystm=strict\n", 1));
    assert!(
        text(&out).contains("Unknown key 'ProtectSystm'"),
        "canary: systemd-analyze verify missed a misspelt key:\n{}",
        text(&out)
    );
    let bare = tempdir();
    let minimal = "[Service]\nExecStart=/usr/local/bin/lockprobe serve --config /etc/lockprobe/lockprobe.toml\n";
    assert_rejected("systemd-analyze security", &security(bare.path(), minimal), "Overall exposure level");

    // The unit agrees with the config and the example environment file.
    let config = config();
    let state_file = Path::new(config["state_file"].as_str().unwrap());
    let line =
        |key: &str| unit.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key} in the unit"));
    assert_eq!(Path::new("/var/lib").join(line("StateDirectory=")), state_file.parent().unwrap());
    assert_eq!(line("ExecStart="), format!("/usr/local/bin/lockprobe serve --config {CONFIG_PATH}"));
    assert!(line("ExecReload=").contains("-HUP $MAINPID"));
    let example = read(root().join("deploy/systemd/lockprobe.env.example"));
    let keys: BTreeSet<String> = example
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| Some(l.split_once('=')?.0.to_string()))
        .collect();
    assert!(api_key_envs(&config).is_subset(&keys), "lockprobe.env.example lacks a key the config names: {keys:?}");
}

/// Every alert of alerts/*.rules.yml has a section in docs/runbook.md under a stable anchor,
/// its name in lower case, and a `runbook_url` annotation pointing there.
#[test]
fn every_alert_has_a_runbook_section() {
    let runbook = read(root().join("docs/runbook.md"));
    let mut alerts = Vec::new();
    for entry in std::fs::read_dir(root().join("alerts")).unwrap() {
        let path = entry.unwrap().path();
        if path.to_str().unwrap().ends_with(".rules.yml") {
            let text = read(&path);
            // Each rule's text runs from its `- alert:` line to the next one.
            let mut rules = text.split("- alert:").skip(1);
            for rule in rules.by_ref() {
                let name = rule.lines().next().unwrap().trim().to_string();
                let url = format!("runbook_url: \"docs/runbook.md#{}\"", name.to_lowercase());
                assert!(rule.contains(&url), "{}: {name} has no {url}", path.display());
                alerts.push(name);
            }
        }
    }
    assert!(alerts.len() >= 17, "found only {alerts:?}");
    for alert in alerts {
        let section = format!("<a id=\"{}\"></a>\n### {alert} (", alert.to_lowercase());
        assert!(runbook.contains(&section), "docs/runbook.md has no section for {alert} (expected {section:?})");
    }
}

/// The Secrets the pods read (keys, web configuration, certificate) and the scrape sends
/// (its CA, its user).
fn secrets_read(objects: &[Value]) -> BTreeSet<String> {
    let pod = &find(objects, "StatefulSet", "lockprobe")["spec"]["template"]["spec"];
    let mut names = BTreeSet::new();
    for source in pod["containers"][0]["envFrom"].as_array().into_iter().flatten() {
        names.insert(str_of(&source["secretRef"]["name"]).to_owned());
    }
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        if let Some(name) = volume["secret"]["secretName"].as_str() {
            names.insert(name.to_owned());
        }
    }
    let endpoint = &find(objects, "ServiceMonitor", "lockprobe")["spec"]["endpoints"][0];
    for name in [
        &endpoint["tlsConfig"]["ca"]["secret"]["name"],
        &endpoint["basicAuth"]["username"]["name"],
        &endpoint["basicAuth"]["password"]["name"],
    ] {
        names.insert(str_of(name).to_owned());
    }
    names
}

/// Every `kubectl` command in the docs names what the manifests make: a `kind/name` is a
/// rendered object (a `deploy/lockprobe` once stood for a StatefulSet), a `-l` selector
/// matches a rendered object's labels, and the Secret it creates is the one the pod reads.
#[test]
fn kubectl_commands_in_the_docs_name_rendered_objects() {
    let mut objects = rendered_objects();
    objects.extend(objects_of(&root().join("deploy/kubernetes/secret.example.yaml")));
    let kinds = [
        ("statefulset", "StatefulSet"),
        ("sts", "StatefulSet"),
        ("deploy", "Deployment"),
        ("deployment", "Deployment"),
        ("svc", "Service"),
        ("service", "Service"),
        ("configmap", "ConfigMap"),
        ("cm", "ConfigMap"),
        ("secret", "Secret"),
        ("pod", "Pod"),
        ("pdb", "PodDisruptionBudget"),
        ("networkpolicy", "NetworkPolicy"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs")).unwrap().map(|e| e.unwrap().path()).collect();
    docs.push(root().join("README.md"));
    let mut checked = 0;
    let mut stale = Vec::new();
    for doc in docs.iter().filter(|p| p.extension().is_some_and(|e| e == "md")) {
        let text = read(doc);
        let rel = doc.strip_prefix(root()).unwrap().display().to_string();
        // A command may continue on the next line (a trailing backslash).
        let joined = text.replace("\\\n", " ");
        for (n, line) in joined.lines().enumerate() {
            for call in line.split("kubectl ").skip(1) {
                let words: Vec<&str> =
                    call.split(|c: char| c.is_whitespace() || c == '`').take_while(|w| !w.is_empty()).collect();
                for (i, word) in words.iter().enumerate() {
                    let a_path = i > 0 && matches!(words[i - 1], "-k" | "-f" | "--kustomize" | "--filename");
                    if a_path {
                        continue;
                    }
                    if let Some((short, name)) = word.split_once('/') {
                        let Some((_, kind)) = kinds.iter().find(|(k, _)| *k == short) else { continue };
                        checked += 1;
                        if !objects.iter().any(|o| o["kind"] == *kind && o["metadata"]["name"] == name) {
                            stale.push(format!("{rel}:{}: {word} (no {kind} named {name})", n + 1));
                        }
                    } else if *word == "-l" {
                        let Some((key, value)) = words.get(i + 1).and_then(|s| s.split_once('=')) else { continue };
                        checked += 1;
                        if !objects.iter().any(|o| o["metadata"]["labels"][key] == value) {
                            stale.push(format!("{rel}:{}: -l {key}={value} selects nothing", n + 1));
                        }
                    } else if (*word == "generic" || *word == "tls") && i > 0 && words[i - 1] == "secret" {
                        let name = words.get(i + 1).copied().unwrap_or_default();
                        checked += 1;
                        if !secrets_read(&objects).contains(name) {
                            stale.push(format!(
                                "{rel}:{}: secret {name} is read by neither the pod nor the scrape",
                                n + 1
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(checked >= 3, "only {checked} kubectl references found: the scan is broken");
    assert!(stale.is_empty(), "kubectl commands naming what the manifests do not make:\n{}", stale.join("\n"));
}

/// Every `lockprobe:<tag>` image reference in `text` (`lockprobe:0.1.0`,
/// `registry.example.com/lockprobe:0.1.0`): not `urn:lockprobe:...`, a module path
/// (`lockprobe::store`), a title (`lockprobe: synthetic ...`), a mount
/// (`-v ./conf:/etc/lockprobe:ro`) or a tag left to a shell variable (`lockprobe:$version`).
/// Each with its line number.
fn image_tags(text: &str) -> Vec<(usize, String)> {
    let mut tags = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(at) = line[from..].find("lockprobe:").map(|i| from + i) {
            from = at + "lockprobe:".len();
            let before = line[..at].chars().next_back();
            if before.is_some_and(|c| c == ':' || c == '_' || c == '-' || c.is_ascii_alphanumeric()) {
                continue;
            }
            let word = line[..at].rsplit(|c: char| c.is_whitespace() || "`\"'=(".contains(c)).next().unwrap_or("");
            if word.starts_with(['/', '.']) || word.contains(":/") {
                continue;
            }
            let tag: String = line[from..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                .collect();
            let tag = tag.trim_end_matches('.');
            if tag.starts_with(|c: char| c.is_ascii_alphanumeric()) {
                tags.push((n + 1, tag.to_owned()));
            }
        }
    }
    tags
}

/// Every file below `dir` (recursively).
fn files_below(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_below(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The image the manifests, the container recipe and the docs name is the crate's
/// version, `lockprobe:<version>`: what `docker build -t` makes, what the StatefulSet and
/// the kustomization's `images:` run, what the docs' examples show. A release tags its
/// image so (.github/workflows/release.yml), so a version bump moves them all.
#[test]
fn image_references_are_the_crate_version() {
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        image_tags(concat!(
            "image: lockprobe:dev\n",
            "urn:lockprobe:error:x lockprobe::store `lockprobe: a` lockprobe:$v -v a:/etc/lockprobe:ro r.io/lockprobe:1.2.3.\n",
            "docker run -v \"$PWD/x.toml:/etc/x.toml:ro\" localhost:5000/lockprobe:2 ./lockprobe:3"
        )),
        [(1, "dev".to_owned()), (2, "1.2.3".to_owned()), (3, "2".to_owned())],
        "the scan finds image references and nothing else"
    );

    let mut files = Vec::new();
    files_below(&root().join("deploy"), &mut files);
    files_below(&root().join("docs"), &mut files);
    files.push(root().join("README.md"));
    let mut found = 0;
    let mut stale = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        for (n, tag) in image_tags(&text) {
            found += 1;
            if tag != version {
                stale.push(format!("{rel}:{n}: lockprobe:{tag}"));
            }
        }
        // kustomize's `images:` set the tag apart from the name (the kustomization, and
        // the docs' example of one).
        for (n, line) in text.lines().enumerate() {
            if let Some(tag) = line.trim().strip_prefix("newTag:") {
                found += 1;
                let tag = tag.trim().trim_matches('"').trim_matches('\'');
                if tag != version {
                    stale.push(format!("{rel}:{}: newTag: {tag}", n + 1));
                }
            }
        }
    }
    assert!(stale.is_empty(), "image tags that are not the crate version {version}:\n{}", stale.join("\n"));
    assert!(found >= 6, "only {found} image references found: the scan is broken");

    let statefulset = read(root().join("deploy/kubernetes/statefulset.yaml"));
    assert!(
        statefulset.contains(&format!("image: lockprobe:{version}\n")),
        "the StatefulSet's image is not lockprobe:{version}"
    );
    let objects = rendered_objects();
    let pod = &find(&objects, "StatefulSet", "lockprobe")["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["image"], format!("lockprobe:{version}"), "the image kustomize renders");
}

/// The `uses:` of a workflow that are not pinned to a full version tag (`v1.2.3`) or a
/// commit: a moving `v4` or a branch runs whatever it points at on the day.
fn unpinned_actions(workflow: &str) -> Vec<String> {
    workflow
        .lines()
        .filter_map(|l| l.trim().trim_start_matches("- ").strip_prefix("uses:"))
        .map(|u| u.trim().trim_matches('"').to_owned())
        .filter(|u| {
            let Some((_, pin)) = u.split_once('@') else { return !u.starts_with("./") };
            let tag = pin.strip_prefix('v').map(|v| v.split('.').collect::<Vec<_>>());
            let full_tag = tag.is_some_and(|parts| parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()));
            let commit = pin.len() == 40 && pin.chars().all(|c| c.is_ascii_hexdigit());
            !(full_tag || commit)
        })
        .collect()
}

/// .github/workflows/release.yml is a valid GitHub workflow (check-jsonschema's vendored
/// schema, offline: the workflow can only be linted here), pins its actions, runs the test
/// command, and builds, sums and describes what it publishes. The canary: the same
/// workflow with a job that lost its `runs-on` is refused.
#[test]
fn release_workflow_passes_the_workflow_schema() {
    let check = |file: &Path| {
        run(Command::new(venv_tool("check-jsonschema")).args(["--builtin-schema", "vendor.github-workflows"]).arg(file))
    };
    let path = root().join(".github/workflows/release.yml");
    let workflow = read(&path);

    let dir = tempdir();
    let broken = dir.path().join("release.yml");
    let runs_on = workflow.find("    runs-on:").expect("a job with runs-on");
    let line_end = runs_on + workflow[runs_on..].find('\n').unwrap() + 1;
    std::fs::write(&broken, format!("{}{}", &workflow[..runs_on], &workflow[line_end..])).unwrap();
    assert_rejected("check-jsonschema", &check(&broken), "'runs-on' is a required property");

    assert_success("check-jsonschema --builtin-schema vendor.github-workflows release.yml", &check(&path));

    assert_eq!(
        unpinned_actions("- uses: actions/checkout@v4\n  uses: a/b@main\n- uses: a/b@v1.2.3\n"),
        ["actions/checkout@v4", "a/b@main"]
    );
    let unpinned = unpinned_actions(&workflow);
    assert!(unpinned.is_empty(), "actions not pinned to a version tag or commit: {unpinned:?}");

    assert!(workflow.contains("tags: [\"v*\"]"), "the release runs on v* tags");
    for step in [
        "run: bash scripts/test.sh",
        "cargo build --release --locked --bin lockprobe",
        "docker build -f deploy/container/Dockerfile -t \"lockprobe:${VERSION}\"",
        "sha256sum",
        "cargo cyclonedx",
        "anchore/sbom-action@",
        "gh release create",
    ] {
        assert!(workflow.contains(step), "release.yml does not run {step:?}");
    }
    // The binary is built on the image's build stage, so both link the same glibc.
    let dockerfile = read(root().join("deploy/container/Dockerfile"));
    let rust_image = dockerfile.lines().find_map(|l| l.strip_prefix("ARG RUST_IMAGE=")).expect("ARG RUST_IMAGE");
    assert!(workflow.contains(&format!("container: {rust_image}\n")), "the binary is not built on {rust_image}");
}
