package e2e

import (
	"bufio"
	"net"
	"net/url"
	"os"
	"os/exec"
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

	// effective is what the jetgres container runs with: command line over environment
	// over the binary's default.
	effective := map[string]string{}
	for name, f := range flags {
		effective[name] = f.def
	}
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
		df, err := os.ReadFile("../Dockerfile")
		if err != nil {
			t.Fatal(err)
		}
		var froms, exposed []string
		for _, line := range strings.Split(string(df), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) >= 2 && strings.EqualFold(f[0], "FROM"):
				froms = append(froms, f[1])
			case len(f) >= 2 && strings.EqualFold(f[0], "EXPOSE"):
				exposed = append(exposed, f[1:]...)
			}
		}
		if len(froms) < 2 || !strings.HasPrefix(froms[0], "golang:1.26") {
			t.Errorf("want a multi-stage build from golang:1.26, got stages %v", froms)
		}
		for _, name := range []string{"listen", "http"} {
			_, port, _ := net.SplitHostPort(flags[name].def)
			if !slices.Contains(exposed, port) {
				t.Errorf("Dockerfile does not EXPOSE %s (--%s)", port, name)
			}
		}
	})
}
