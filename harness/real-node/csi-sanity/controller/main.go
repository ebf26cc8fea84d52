// Command controller is the smallest CSI controller csi-sanity needs to run its node specs
// that start from a created volume ("should remove target path", "volume does not exist on the
// specified path") against csi.athenz.io, which has no controller: its CreateVolume answers
// with the volume context kubelet would pass for an inline ephemeral volume of one pod (given
// by the test, a pod that exists on the node), and DeleteVolume forgets nothing. The node
// service under test is the agent's, unchanged; only where the volume "comes from" is played.
//
// Usage: controller --endpoint /path/ctl.sock --context key=value [--context key=value ...]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type contextFlag map[string]string

func (c contextFlag) String() string { return fmt.Sprint(map[string]string(c)) }

func (c contextFlag) Set(v string) error {
	key, value, ok := strings.Cut(v, "=")
	if !ok || key == "" {
		return fmt.Errorf("--context %q: want key=value", v)
	}
	c[key] = value
	return nil
}

type controller struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	volumeContext map[string]string
	created       atomic.Uint64
}

func (c *controller) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "csi.athenz.io", VendorVersion: "sanity-controller"}, nil
}

func (c *controller) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_CONTROLLER_SERVICE,
		}},
	}}}, nil
}

func (c *controller) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (c *controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{
			Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		}},
	}}}, nil
}

// CreateVolume names a new volume as kubelet names an inline one (csi- and hex), with the pod's
// volume context.
func (c *controller) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:      fmt.Sprintf("csi-%064x", c.created.Add(1)),
		VolumeContext: c.volumeContext,
	}}, nil
}

func (c *controller) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func main() {
	endpoint := flag.String("endpoint", "", "Unix socket to serve on")
	volumeContext := contextFlag{}
	flag.Var(volumeContext, "context", "key=value of every created volume's context (repeat)")
	flag.Parse()
	if *endpoint == "" {
		log.Fatal("--endpoint is required")
	}
	if err := os.Remove(*endpoint); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Fatal(err)
	}
	listener, err := net.Listen("unix", *endpoint)
	if err != nil {
		log.Fatal(err)
	}
	server := grpc.NewServer()
	c := &controller{volumeContext: volumeContext}
	csi.RegisterIdentityServer(server, c)
	csi.RegisterControllerServer(server, c)
	go func() {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
		server.GracefulStop()
	}()
	if err := server.Serve(listener); err != nil {
		log.Fatal(err)
	}
}
