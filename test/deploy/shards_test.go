package deploy

import (
	"net/url"
	"os"
	"os/exec"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/mandated/mandated/sink/shardmap"
)

var partitionsArg = regexp.MustCompile(`topics create --partitions (\d+)`)

// partitionCount reads the --partitions a migration script creates the topics with.
func partitionCount(t *testing.T, script string) int32 {
	t.Helper()
	m := partitionsArg.FindStringSubmatch(script)
	require.NotNil(t, m, "the script creates the topics: %q", script)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return int32(n)
}

// checkShardMap parses a shard map as mandated does, with url_file read
// from files (path → content), and checks it covers the partitions.
func checkShardMap(t *testing.T, text string, files map[string]string, partitions int32) *shardmap.Map {
	t.Helper()
	var m shardmap.Map
	dec := yaml.NewDecoder(strings.NewReader(text))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&m))
	for i := range m.Shards {
		if f := m.Shards[i].URLFile; f != "" {
			u, ok := files[f]
			require.True(t, ok, "shard %s: url_file %s is mounted", m.Shards[i].Name, f)
			m.Shards[i].URL = u
		}
	}
	require.NoError(t, m.Validate())
	require.NoError(t, m.Cover(partitions), "the shards cover the %d partitions the topics are created with", partitions)
	require.Len(t, m.Shards, 2, "the example has two shards")
	return &m
}

func TestTwoShardExample(t *testing.T) {
	t.Parallel()
	t.Run("compose: the override runs every replica, the init job and mandatectl on shards.yaml, with a second PostgreSQL", func(t *testing.T) {
		base := composeFile(t)
		over := yamlDocs(t, deployPath(t, "compose", "docker-compose.shards.yaml"))[0]
		services := over["services"].(map[string]any)
		require.NotNil(t, dig(services, "postgres-b", "healthcheck"), "postgres-b is probed")
		require.Equal(t, "service_healthy", str(dig(services, "mandated-init", "depends_on", "postgres-b", "condition")),
			"the schema is applied once both shards answer")
		want := []string{"mandated-init", "mandatectl"}
		for name := range mandatedServices(t, base) {
			want = append(want, name)
		}
		require.Len(t, want, 5)
		for _, name := range want {
			env := stringMap(t, dig(services, name, "environment"), name+" environment")
			require.Equal(t, "", env["MANDATED_DATABASE_URL"], "%s: the map names every database", name)
			require.Equal(t, "/etc/mandated/shards.yaml", env["MANDATED_SHARD_MAP"], name)
			require.Contains(t, toStrings(dig(services, name, "volumes")), "./shards.yaml:/etc/mandated/shards.yaml:ro", name)
		}
		text, err := os.ReadFile(deployPath(t, "compose", "shards.yaml"))
		require.NoError(t, err)
		m := checkShardMap(t, string(text), nil, partitionCount(t, str(dig(base, "services", "mandated-init", "command", 0))))
		baseServices := base["services"].(map[string]any)
		for _, s := range m.Shards {
			u, err := url.Parse(s.URL)
			require.NoError(t, err)
			host := u.Hostname()
			_, inBase := baseServices[host]
			_, inOver := services[host]
			require.True(t, inBase || inOver, "shard %s's host %s is a service of the stack", s.Name, host)
		}
		require.NotEqual(t, m.Shards[0].URL, m.Shards[1].URL)
	})

	t.Run("kubernetes: the overlay mounts the map and the shard URLs in every pod that reaches PostgreSQL", func(t *testing.T) {
		dir := deployPath(t, "kubernetes-shards")
		cm := yamlDocs(t, path.Join(dir, "shard-map.yaml"))[0]
		secret := yamlDocs(t, path.Join(dir, "shard-urls.yaml"))[0]
		files := map[string]string{}
		for k, v := range stringMap(t, secret["stringData"], "the shard URLs") {
			files["/etc/mandated/shard-urls/"+k] = v
		}
		job := one(t, k8sObjects(t), "Job")
		checkShardMap(t, str(dig(cm, "data", "shards.yaml")), files,
			partitionCount(t, str(dig(job, "spec", "template", "spec", "containers", 0, "args", 0))))
		// The gateway reads the same map, the url_files from a Secret of its
		// own mounted at the same path: every shard as its read-only role.
		gwSecret := yamlDocs(t, path.Join(dir, "gateway-shard-urls.yaml"))[0]
		gwFiles := map[string]string{}
		for k, v := range stringMap(t, gwSecret["stringData"], "the gateway's shard URLs") {
			gwFiles["/etc/mandated/shard-urls/"+k] = v
			u, err := url.Parse(v)
			require.NoError(t, err)
			require.Equal(t, "mandated_gateway", u.User.Username(), "%s: the gateway's role (deploy/postgres/gateway-role.sql)", k)
		}
		checkShardMap(t, str(dig(cm, "data", "shards.yaml")), gwFiles,
			partitionCount(t, str(dig(job, "spec", "template", "spec", "containers", 0, "args", 0))))

		kubectl, err := exec.LookPath("kubectl")
		if err != nil {
			t.Skip("kubectl is not installed; the YAML checks above still ran")
		}
		out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
		require.NoError(t, err, "%s", out)
		dec := yaml.NewDecoder(strings.NewReader(string(out)))
		seen := map[string]bool{}
		for {
			var doc map[string]any
			if dec.Decode(&doc) != nil {
				break
			}
			kind, name := str(doc["kind"]), str(dig(doc, "metadata", "name"))
			var pod any
			switch kind {
			case "StatefulSet", "Job":
				pod = dig(doc, "spec", "template", "spec")
			case "CronJob":
				pod = dig(doc, "spec", "jobTemplate", "spec", "template", "spec")
			case "Deployment":
				pod = dig(doc, "spec", "template", "spec")
			case "Secret":
				if name == "mandated-secrets" || name == "mandate-gateway-secrets" {
					_, has := stringMap(t, doc["stringData"], name)["MANDATED_DATABASE_URL"]
					require.False(t, has, "%s: the base Secret's database URL is dropped", name)
				}
				continue
			default:
				continue
			}
			seen[kind] = true
			c := dig(pod, "containers", 0)
			var mapPath string
			for _, e := range dig(c, "env").([]any) {
				if str(dig(e, "name")) == "MANDATED_SHARD_MAP" {
					mapPath = str(dig(e, "value"))
				}
			}
			require.Equal(t, "/etc/mandated/shard-map/shards.yaml", mapPath, "%s %s reads the map", kind, name)
			mounts := map[string]string{}
			for _, vm := range dig(c, "volumeMounts").([]any) {
				mounts[str(dig(vm, "mountPath"))] = str(dig(vm, "name"))
			}
			volumes := map[string]any{}
			for _, v := range dig(pod, "volumes").([]any) {
				volumes[str(dig(v, "name"))] = v
			}
			require.Equal(t, "mandated-shard-map", str(dig(volumes[mounts["/etc/mandated/shard-map"]], "configMap", "name")), "%s %s", kind, name)
			urls := "mandated-shard-urls"
			if kind == "Deployment" {
				urls = "mandate-gateway-shard-urls"
			}
			require.Equal(t, urls, str(dig(volumes[mounts["/etc/mandated/shard-urls"]], "secret", "secretName")), "%s %s", kind, name)
		}
		require.Equal(t, map[string]bool{"StatefulSet": true, "Job": true, "CronJob": true, "Deployment": true}, seen)
	})
}
