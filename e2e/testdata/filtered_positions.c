/* A filtered push consumer through nats.c's js_SubscribeSync, as nats.c's own test of it:
   three messages on its subject among others, each acked, then the positions its consumer
   info reports. Prints "delivered=<stream seq> ack_floor=<stream seq>". */
#include <nats/nats.h>
#include <stdio.h>

static int fail(const char *what, natsStatus s, jsErrCode jerr)
{
    fprintf(stderr, "%s: %s (err_code %d)\n", what, natsStatus_GetText(s), (int) jerr);
    return 1;
}

int main(int argc, char **argv)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    natsSubscription *sub = NULL;
    jsConsumerInfo *ci = NULL;
    jsStreamConfig cfg;
    jsSubOptions so;
    jsErrCode jerr = 0;
    natsStatus s;
    const char *subjects[] = {"cf.>"};
    const char *pubs[] = {"cf.a", "cf.b", "cf.a", "cf.b", "cf.a", "cf.b", "cf.b", "cf.b", "cf.b"};
    int i;

    if (argc != 2)
        return 2;
    if ((s = natsConnection_ConnectTo(&nc, argv[1])) != NATS_OK)
        return fail("connect", s, 0);
    if ((s = natsConnection_JetStream(&js, nc, NULL)) != NATS_OK)
        return fail("jetstream", s, 0);
    jsStreamConfig_Init(&cfg);
    cfg.Name = "CF";
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    if ((s = js_AddStream(NULL, js, &cfg, NULL, &jerr)) != NATS_OK)
        return fail("add stream", s, jerr);
    for (i = 0; i < 9; i++)
        if ((s = js_Publish(NULL, js, pubs[i], "x", 1, NULL, &jerr)) != NATS_OK)
            return fail("publish", s, jerr);
    jsSubOptions_Init(&so);
    so.Config.AckPolicy = js_AckExplicit;
    if ((s = js_SubscribeSync(&sub, js, "cf.a", NULL, &so, &jerr)) != NATS_OK)
        return fail("subscribe", s, jerr);
    for (i = 0; i < 3; i++)
    {
        natsMsg *msg = NULL;
        if ((s = natsSubscription_NextMsg(&msg, sub, 5000)) != NATS_OK)
            return fail("next message", s, 0);
        if ((s = natsMsg_AckSync(msg, NULL, &jerr)) != NATS_OK)
            return fail("ack", s, jerr);
        natsMsg_Destroy(msg);
    }
    if ((s = natsSubscription_GetConsumerInfo(&ci, sub, NULL, &jerr)) != NATS_OK)
        return fail("consumer info", s, jerr);
    printf("delivered=%llu ack_floor=%llu\n", (unsigned long long) ci->Delivered.Stream, (unsigned long long) ci->AckFloor.Stream);
    jsConsumerInfo_Destroy(ci);
    natsSubscription_Destroy(sub);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return 0;
}
