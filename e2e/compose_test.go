package e2e

import (
	"bufio"
	"encoding/json"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// composeFile is the part of docker-compose.yml the checks below read.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       *composeBuild     `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

// binaryFlag is one flag as `jetgres help` reports it.
type binaryFlag struct {
	env []string
	def string
}

var helpLine = regexp.MustCompile(`^  --(\S+)\s+(\S+(?:, \S+)*)(?:\s+\(default (.*)\))?$`)

// binaryFlags asks the built binary which flags and environment variables it has.
func binaryFlags(t *testing.T) map[string]binaryFlag {
	t.Helper()
	out, err := exec.Command(jetgresBinary(t), "help").Output()
	if err != nil {
		t.Fatalf("jetgres help: %v", err)
	}
	flags := map[string]binaryFlag{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if m := helpLine.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = binaryFlag{env: strings.Split(m[2], ", "), def: m[3]}
		}
	}
	if len(flags) == 0 {
		t.Fatalf("no flags found in jetgres help:\n%s", out)
	}
	return flags
}

// TestComposeFileAgreesWithBinary checks docker-compose.yml and the Dockerfile against the
// flags of the binary they are meant to run.
func TestComposeFileAgreesWithBinary(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	flags := binaryFlags(t)
	envFlag := map[string]string{}
	for name, f := range flags {
		for _, e := range f.env {
			envFlag[e] = name
		}
	}

	pgSvc, ok := cf.Services["postgres"]
	if !ok {
		t.Fatal("no postgres service")
	}
	jg, ok := cf.Services["jetgres"]
	if !ok {
		t.Fatal("no jetgres service")
	}

	t.Run("postgres", func(t *testing.T) {
		if !strings.HasPrefix(pgSvc.Image, "postgres:") {
			t.Errorf("image %q is not the official postgres image", pgSvc.Image)
		}
		if pgSvc.Healthcheck == nil || !strings.Contains(strings.Join(pgSvc.Healthcheck.Test, " "), "pg_isready") {
			t.Errorf("healthcheck does not run pg_isready")
		}
		named := false
		for _, v := range pgSvc.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if _, ok := cf.Volumes[src]; ok {
				named = true
			}
		}
		if !named {
			t.Errorf("no named volume among %v", pgSvc.Volumes)
		}
	})

	df := readDockerfile(t)
	image := imageSettings(t, flags, envFlag, df)
	// effective is what the jetgres container runs with: command line over the service's
	// environment over the image's.
	effective := maps.Clone(image)
	for k, v := range jg.Environment {
		name, ok := envFlag[k]
		if !ok {
			t.Errorf("jetgres service sets %s, which is no flag's environment variable", k)
			continue
		}
		effective[name] = v
	}
	args := jg.Command
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	for i := 0; i < len(args); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") {
			t.Errorf("jetgres command: unexpected argument %q", args[i])
			continue
		}
		if _, ok := flags[name]; !ok {
			t.Errorf("jetgres command uses --%s, which the binary does not have", name)
			continue
		}
		if !hasValue && i+1 < len(args) {
			i++
			value = args[i]
		}
		effective[name] = value
	}

	t.Run("jetgres", func(t *testing.T) {
		if jg.Build == nil || jg.Build.Dockerfile == "" {
			t.Fatal("jetgres service is not built from a Dockerfile")
		}
		if _, err := os.Stat("../" + jg.Build.Context + "/" + jg.Build.Dockerfile); err != nil {
			t.Errorf("build: %v", err)
		}
		if jg.DependsOn["postgres"].Condition != "service_healthy" {
			t.Errorf("jetgres does not wait for postgres to be healthy: %+v", jg.DependsOn)
		}

		db, err := url.Parse(effective["database-url"])
		if err != nil || db.Host == "" {
			t.Fatalf("database URL %q: %v", effective["database-url"], err)
		}
		pw, _ := db.User.Password()
		if db.Hostname() != "postgres" || db.User.Username() != pgSvc.Environment["POSTGRES_USER"] ||
			pw != pgSvc.Environment["POSTGRES_PASSWORD"] || strings.TrimPrefix(db.Path, "/") != pgSvc.Environment["POSTGRES_DB"] {
			t.Errorf("database URL %s does not match the postgres service %v", db.Redacted(), pgSvc.Environment)
		}
	})

	t.Run("ports", func(t *testing.T) {
		published := map[string]string{} // container port -> host port
		for _, p := range jg.Ports {
			parts := strings.Split(p, ":")
			if len(parts) < 2 {
				t.Errorf("port %q publishes no host port", p)
				continue
			}
			published[parts[len(parts)-1]] = parts[len(parts)-2]
		}
		for _, name := range []string{"listen", "http"} {
			host, port, err := net.SplitHostPort(effective[name])
			if err != nil {
				t.Fatalf("--%s %q: %v", name, effective[name], err)
			}
			if host != "0.0.0.0" && host != "" {
				t.Errorf("--%s %s inside the container is not reachable through a published port", name, effective[name])
			}
			_, defPort, _ := net.SplitHostPort(flags[name].def)
			if port != defPort {
				t.Errorf("--%s port %s differs from the default %s", name, port, defPort)
			}
			if published[port] != defPort {
				t.Errorf("--%s: container port %s published as %q, want %s", name, port, published[port], defPort)
			}
			delete(published, port)
		}
		for c, h := range published {
			t.Errorf("port %s:%s is published but jetgres does not listen on it", h, c)
		}
	})

	t.Run("Dockerfile", func(t *testing.T) {
		if len(df.froms) < 2 || !strings.HasPrefix(df.froms[0], "golang:1.26") {
			t.Errorf("want a multi-stage build from golang:1.26, got stages %v", df.froms)
		}
		for _, name := range []string{"listen", "http"} {
			_, port, _ := net.SplitHostPort(flags[name].def)
			if !slices.Contains(df.exposed, port) {
				t.Errorf("Dockerfile does not EXPOSE %s (--%s)", port, name)
			}
		}
	})

	// `docker run -p 4222:4222 -p 8080:8080 <image>`, without compose and without a
	// database: both listeners reachable through the published ports, and the private
	// cluster's binaries in the image, its data in a volume.
	t.Run("docker run", func(t *testing.T) {
		for _, name := range []string{"listen", "http"} {
			host, port, err := net.SplitHostPort(image[name])
			if err != nil {
				t.Fatalf("--%s %q: %v", name, image[name], err)
			}
			if host != "0.0.0.0" && host != "" {
				t.Errorf("the image's --%s %s is not reachable through a published port", name, image[name])
			}
			if _, defPort, _ := net.SplitHostPort(flags[name].def); port != defPort {
				t.Errorf("the image's --%s port %s differs from the default %s", name, port, defPort)
			}
		}
		if image["database-url"] != "" {
			t.Fatalf("the image sets a database URL; docker run would need that database")
		}
		if !slices.ContainsFunc(df.runs, func(r string) bool {
			return strings.Contains(r, "apt-get install") && regexp.MustCompile(`\bpostgresql-\d+\b`).MatchString(r)
		}) {
			t.Errorf("the runtime stage installs no PostgreSQL server package: the private cluster cannot start")
		}
		dataDir := image["data-dir"]
		if !filepath.IsAbs(dataDir) || !slices.ContainsFunc(df.volumes, func(v string) bool { return within(dataDir, v) }) {
			t.Errorf("the image's --data-dir %q is not in one of its volumes %v", dataDir, df.volumes)
		}
		if df.user == "" || df.user == "root" || df.user == "0" {
			t.Errorf("the image runs jetgres as %q; as root it would need a data directory other users can enter", df.user)
		}
	})
}

// dockerfile is what the checks read from the Dockerfile; all but froms are of its last
// stage, the image.
type dockerfile struct {
	froms   []string
	exposed []string
	env     map[string]string
	volumes []string
	runs    []string
	user    string
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var df dockerfile
	// Join continued lines, then read one instruction a line.
	text := strings.ReplaceAll(string(raw), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			df.froms = append(df.froms, f[1])
			df.exposed, df.env, df.volumes, df.runs, df.user = nil, map[string]string{}, nil, nil, ""
		case "EXPOSE":
			df.exposed = append(df.exposed, f[1:]...)
		case "ENV":
			for _, kv := range f[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("Dockerfile: ENV %s: write ENV KEY=value", kv)
				}
				df.env[k] = strings.Trim(v, `"`)
			}
		case "VOLUME":
			var vs []string
			if err := json.Unmarshal([]byte(strings.Join(f[1:], " ")), &vs); err != nil {
				vs = f[1:]
			}
			df.volumes = append(df.volumes, vs...)
		case "RUN":
			df.runs = append(df.runs, strings.Join(f[1:], " "))
		case "USER":
			df.user = f[1]
		}
	}
	return df
}

// imageSettings is what the image runs with when given nothing: its environment over the
// binary's defaults.
func imageSettings(t *testing.T, flags map[string]binaryFlag, envFlag map[string]string, df dockerfile) map[string]string {
	t.Helper()
	settings := map[string]string{}
	for name, f := range flags {
		settings[name] = f.def
	}
	for k, v := range df.env {
		if name, ok := envFlag[k]; ok {
			settings[name] = v
		} else if strings.HasPrefix(k, "JETGRES_") {
			t.Errorf("Dockerfile sets %s, which is no flag's environment variable", k)
		}
	}
	return settings
}

// composeKeys are the keys docker-compose.yml may use: those both Compose v2 and the
// docker-compose 1.29 that Debian packages accept (1.29 validates against the Compose
// Specification of its day, without a top-level name; v2 warns about version). Keys
// starting with x- are extensions, which both accept.
var composeKeys = map[string][]string{
	"":            {"services", "volumes", "networks", "secrets", "configs"},
	"service":     {"build", "command", "container_name", "depends_on", "entrypoint", "env_file", "environment", "expose", "healthcheck", "image", "init", "labels", "logging", "networks", "ports", "restart", "stop_grace_period", "stop_signal", "tmpfs", "ulimits", "user", "volumes", "working_dir"},
	"build":       {"context", "dockerfile", "args", "labels", "target"},
	"healthcheck": {"test", "interval", "timeout", "retries", "start_period", "disable"},
	"depends_on":  {"condition"},
	"volume":      {"driver", "driver_opts", "external", "labels", "name"},
}

// TestComposeFileLoadsInBothComposes checks every key of docker-compose.yml against what
// both Compose v2 and docker-compose 1.29 accept.
func TestComposeFileLoadsInBothComposes(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	check := func(where, kind string, m any) map[string]any {
		t.Helper()
		mm, ok := m.(map[string]any)
		if !ok {
			if m != nil {
				t.Errorf("%s: %T, want a mapping", where, m)
			}
			return nil
		}
		for k := range mm {
			if !strings.HasPrefix(k, "x-") && !slices.Contains(composeKeys[kind], k) {
				t.Errorf("%s: key %q is not one both Compose v2 and docker-compose 1.29 accept", where, k)
			}
		}
		return mm
	}
	top := check("top level", "", doc)
	volumes, _ := top["volumes"].(map[string]any)
	for name, v := range volumes {
		check("volume "+name, "volume", v)
	}
	services, _ := top["services"].(map[string]any)
	if len(services) == 0 {
		t.Fatal("no services")
	}
	for name, v := range services {
		svc := check("service "+name, "service", v)
		if b, ok := svc["build"].(map[string]any); ok {
			check(name+".build", "build", b)
		}
		check(name+".healthcheck", "healthcheck", svc["healthcheck"])
		if deps, ok := svc["depends_on"].(map[string]any); ok {
			for dep, d := range deps {
				cond := check(name+".depends_on."+dep, "depends_on", d)
				// 1.29 knows these two conditions only.
				if c := cond["condition"]; c != "service_started" && c != "service_healthy" {
					t.Errorf("%s.depends_on.%s: condition %v", name, dep, c)
				}
			}
		}
		if env, ok := svc["environment"].(map[string]any); ok {
			for k, v := range env {
				if _, ok := v.(string); !ok {
					t.Errorf("%s.environment.%s: %T %v; quote it so that both read the same string", name, k, v, v)
				}
			}
		}
		if ports, ok := svc["ports"].([]any); ok {
			for _, p := range ports {
				// Unquoted, "4222:4222" would be a number to YAML 1.1 for some values (base 60).
				if _, ok := p.(string); !ok {
					t.Errorf("%s.ports: %v is not a quoted string", name, p)
				}
			}
		}
	}
}

// TestReplicasComposeFile checks docker-compose.replicas.yml, which no test can run here:
// three jetgres services on one PostgreSQL, each routed to the three, with distinct names and
// ports, setting only variables and flags the binary has.
func TestReplicasComposeFile(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docker-compose.replicas.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("docker-compose.replicas.yml: %v", err)
	}
	flags := binaryFlags(t)
	envs := map[string]bool{}
	for _, f := range flags {
		for _, e := range f.env {
			envs[e] = true
		}
	}
	if pg, ok := cf.Services["postgres"]; !ok || pg.Healthcheck == nil {
		t.Fatal("no postgres service with a healthcheck")
	}
	names, ports := map[string]bool{}, map[string]bool{}
	for _, svc := range []string{"jetgres1", "jetgres2", "jetgres3"} {
		s, ok := cf.Services[svc]
		if !ok {
			t.Fatalf("no %s service", svc)
		}
		for k := range s.Environment {
			if !envs[k] {
				t.Errorf("%s sets %s, which is no flag's environment variable", svc, k)
			}
		}
		if !strings.Contains(s.Environment["JETGRES_ROUTES"], "nats://"+svc+":6222") || s.Environment["JETGRES_CLUSTER"] != "0.0.0.0:6222" {
			t.Errorf("%s: cluster %q, routes %q do not route to it", svc, s.Environment["JETGRES_CLUSTER"], s.Environment["JETGRES_ROUTES"])
		}
		if s.DependsOn["postgres"].Condition != "service_healthy" {
			t.Errorf("%s does not wait for a healthy postgres", svc)
		}
		args := s.Command
		if len(args) != 3 || args[0] != "serve" || args[1] != "--replica-name" {
			t.Fatalf("%s: command %v, want serve --replica-name <name>", svc, args)
		}
		names[args[2]] = true
		for _, p := range s.Ports {
			if ports[p] {
				t.Errorf("%s: port %s published twice", svc, p)
			}
			ports[p] = true
		}
	}
	if len(names) != 3 {
		t.Errorf("replica names %v are not distinct", names)
	}
}
