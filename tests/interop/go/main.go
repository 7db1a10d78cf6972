// The official RocketMQ 5 Go client against a RocketMQ 5 gRPC endpoint, one scenario at a time.
//
//	interop ENDPOINT SCENARIO... [--prefix P] [--timeout-s S] [--access-key AK --secret-key SK]
//
// Each scenario uses the topic and the consumer group P-SCENARIO (P defaults to
// interop-go-<millis>) and prints one JSON line of what it observed on stdout; progress goes
// to stderr. The exit status is 0 when every scenario ran (whatever it observed), 2 on a usage
// error. The scenarios are those of the Java program (tests/interop/README.md):
//
//   - the digest scenarios (scenarios.go): push, simple and fifo-push send the same 20 bodies
//     and report whether every one arrives uncorrupted, in order for FIFO;
//   - the differential scenarios (differential.go; clients.go, observe.go): normal, fifo,
//     delay, transaction, invisible, retry, tag-filter, large-body, bad-topic and
//     bad-signature report what a server does with each kind of message and each kind of
//     mistake, free of ids and times, under the Java program's key names; they sign their
//     calls with the access key when one is given.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
)

const clientModule = "github.com/apache/rocketmq-clients/golang/v5"

func clientVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == clientModule {
				return strings.TrimPrefix(dep.Version, "v")
			}
		}
	}
	return "unknown"
}

func usage(problem string) {
	fmt.Fprintf(os.Stderr, "interop go: %s\nusage: interop ENDPOINT SCENARIO... [--prefix P] [--timeout-s S] "+
		"[--access-key AK --secret-key SK]; scenarios: %s, %s\n",
		problem, strings.Join(digestNames, ", "), strings.Join(differentialNames, ", "))
	os.Exit(2)
}

func main() {
	var positional []string
	prefix := "interop-go-" + strconv.FormatInt(time.Now().UnixMilli(), 10)
	timeoutS := 30
	var accessKey, secretKey string
	args := os.Args[1:]
	for i := 0; i < len(args); i++ {
		switch {
		case args[i] == "--prefix" && i+1 < len(args):
			i++
			prefix = args[i]
		case args[i] == "--timeout-s" && i+1 < len(args):
			i++
			n, err := strconv.Atoi(args[i])
			if err != nil {
				usage("--timeout-s takes whole seconds")
			}
			timeoutS = n
		case args[i] == "--access-key" && i+1 < len(args):
			i++
			accessKey = args[i]
		case args[i] == "--secret-key" && i+1 < len(args):
			i++
			secretKey = args[i]
		case strings.HasPrefix(args[i], "--"):
			usage("unknown option " + args[i])
		default:
			positional = append(positional, args[i])
		}
	}
	if len(positional) < 2 {
		usage("an endpoint and at least one scenario are needed")
	}
	endpoint, scenarios := positional[0], positional[1:]
	for _, s := range scenarios {
		if !slices.Contains(digestNames, s) && !slices.Contains(differentialNames, s) {
			usage("unknown scenario " + s)
		}
	}
	rmq.EnableSsl = false // the client dials TLS by default; the endpoints here are plaintext
	rmq.ResetLogger()
	answers := recordAnswers()
	version := clientVersion()
	timeout := time.Duration(timeoutS) * time.Second
	for _, s := range scenarios {
		fmt.Fprintf(os.Stderr, "interop go: %s against %s\n", s, endpoint)
		name := prefix + "-" + s
		var out map[string]any
		if slices.Contains(differentialNames, s) {
			out = newDifferential(endpoint, name, accessKey, secretKey, timeout, answers).run(s)
		} else {
			out = newRun(endpoint, name, timeout).run(s)
		}
		out["client"] = "go"
		out["client_version"] = version
		line, err := json.Marshal(out)
		if err != nil {
			panic(err)
		}
		fmt.Println(string(line))
	}
}
