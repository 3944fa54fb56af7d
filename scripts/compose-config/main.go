// compose-config checks a Compose file the way `docker compose config` does, without a
// Docker engine: compose-go (the loader Docker Compose itself uses) reads the file and its
// .env, validates it against the Compose specification, interpolates the variables and
// prints the resolved model as YAML. Any problem is one line on stderr and exit status 1.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) < 2 || len(os.Args) > 3 {
		fmt.Fprintln(os.Stderr, "usage: compose-config COMPOSE_FILE [ENV_FILE]")
		os.Exit(2)
	}
	file, err := filepath.Abs(os.Args[1])
	if err != nil {
		fail(err)
	}
	options := []cli.ProjectOptionsFn{cli.WithWorkingDirectory(filepath.Dir(file)), cli.WithOsEnv}
	if len(os.Args) == 3 {
		options = append(options, cli.WithEnvFiles(os.Args[2]), cli.WithDotEnv)
	}
	opts, err := cli.NewProjectOptions([]string{file}, options...)
	if err != nil {
		fail(err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		fail(err)
	}
	out, err := project.MarshalYAML()
	if err != nil {
		fail(err)
	}
	os.Stdout.Write(out)
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "compose-config: %v\n", err)
	os.Exit(1)
}
