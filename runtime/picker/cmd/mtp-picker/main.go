// Command mtp-picker is the Gateway API Inference Extension's endpoint picker (EPP, the v1.5.0
// runner: flags, InferencePool and pod watch, ext-proc gRPC server, plugin framework) with
// one plugin more: `mtp-traffic-class-filter`, the traffic-class filter the operator's
// EndpointPickerConfig names (docs/routing.md).
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"

	"github.com/mtp-operator/mtp-operator/runtime/picker/classfilter"
)

func main() {
	fwkplugin.Register(classfilter.Type, classfilter.Factory)
	if err := runner.NewRunner().WithExecutableName("mtp-picker").Run(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
