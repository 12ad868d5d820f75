/*
 * tests/unit/test_s3_xml.c - ListObjectsV2 pages, <Error> bodies, the multipart
 * upload and copy results (Initiate, Complete, ListMultipartUploads, CopyObject,
 * CopyPart) and the CompleteMultipartUpload body we build: normal answers,
 * truncation and markers, escaped and non-ASCII keys, url encoding, leading
 * whitespace, and hostile input (malformed, DTDs/entities, oversized, too long).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3_xml.h"

#define HEAD "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
#define NS "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\""

static int parse(const char *xml, struct s3_list_page *p)
{
    return s3_xml_parse_list(xml, strlen(xml), p);
}

Test(s3_xml, list_page_with_contents_and_prefixes)
{
    const char *xml =
        HEAD "<ListBucketResult " NS "><Name>bkt</Name><Prefix>ckpt/</Prefix>"
             "<KeyCount>3</KeyCount><MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter>"
             "<IsTruncated>false</IsTruncated>"
             "<Contents><Key>ckpt/model.bin</Key><LastModified>2009-10-12T17:50:30.000Z"
             "</LastModified><ETag>&quot;fba9dede5f27731c9771645a39863328&quot;</ETag>"
             "<Size>434234</Size><StorageClass>STANDARD</StorageClass></Contents>"
             "<Contents><Key>ckpt/</Key><Size>0</Size></Contents>"
             "<CommonPrefixes><Prefix>ckpt/shards/</Prefix></CommonPrefixes>"
             "<CommonPrefixes><Prefix>ckpt/opt/</Prefix></CommonPrefixes>"
             "</ListBucketResult>";
    struct s3_list_page p;
    cr_assert_eq(parse(xml, &p), 0);
    cr_assert_eq(p.nobjects, 2);
    cr_expect_str_eq(p.objects[0].key, "ckpt/model.bin");
    cr_expect_eq(p.objects[0].size, 434234);
    cr_expect_eq(p.objects[0].mtime_ns, 1255369830000000000LL);
    cr_expect_str_eq(p.objects[0].etag, "\"fba9dede5f27731c9771645a39863328\"");
    cr_expect_str_eq(p.objects[1].key, "ckpt/");
    cr_expect_eq(p.objects[1].mtime_ns, 0);
    cr_expect_str_eq(p.objects[1].etag, "");
    cr_assert_eq(p.nprefixes, 2);
    cr_expect_str_eq(p.prefixes[0], "ckpt/shards/");
    cr_expect_str_eq(p.prefixes[1], "ckpt/opt/");
    cr_expect_eq(p.is_truncated, 0);
    cr_expect_null(p.next_token);
    s3_list_page_free(&p);
}

Test(s3_xml, truncated_page_with_token)
{
    const char *xml = HEAD "<ListBucketResult " NS "><IsTruncated>true</IsTruncated>"
                           "<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="
                           "</NextContinuationToken>"
                           "<Contents><Key>a</Key><Size>1</Size></Contents></ListBucketResult>";
    struct s3_list_page p;
    cr_assert_eq(parse(xml, &p), 0);
    cr_expect_eq(p.is_truncated, 1);
    cr_expect_str_eq(p.next_token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
    s3_list_page_free(&p);
}

Test(s3_xml, truncated_without_token_is_rejected)
{
    const char *xml = HEAD "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>";
    struct s3_list_page p;
    cr_expect_eq(parse(xml, &p), -EINVAL);
    cr_expect_eq(p.nobjects, 0);
}

Test(s3_xml, empty_listing)
{
    struct s3_list_page p;
    cr_assert_eq(parse(HEAD "<ListBucketResult " NS "><KeyCount>0</KeyCount>"
                            "<IsTruncated>false</IsTruncated></ListBucketResult>",
                       &p),
                 0);
    cr_expect_eq(p.nobjects, 0);
    cr_expect_eq(p.nprefixes, 0);
    s3_list_page_free(&p);
}

Test(s3_xml, escaped_and_non_ascii_keys)
{
    const char *xml = HEAD "<ListBucketResult " NS "><IsTruncated>false</IsTruncated>"
                           "<Contents><Key>d/a&amp;b&lt;c&gt;&apos;&quot;.txt</Key><Size>3</Size>"
                           "</Contents>"
                           "<Contents><Key>d/\xc3\xbc\xc3\xb1 \xe6\x97\xa5&#x672C;.bin</Key>"
                           "<Size>4</Size></Contents>"
                           "<Contents><Key><![CDATA[d/x&y]]></Key><Size>5</Size></Contents>"
                           "<CommonPrefixes><Prefix>d/sp ace+plus/</Prefix></CommonPrefixes>"
                           "</ListBucketResult>";
    struct s3_list_page p;
    cr_assert_eq(parse(xml, &p), 0);
    cr_assert_eq(p.nobjects, 3);
    cr_expect_str_eq(p.objects[0].key, "d/a&b<c>'\".txt");
    cr_expect_str_eq(p.objects[1].key, "d/\xc3\xbc\xc3\xb1 \xe6\x97\xa5\xe6\x9c\xac.bin");
    cr_expect_str_eq(p.objects[2].key, "d/x&y");
    cr_expect_str_eq(p.prefixes[0], "d/sp ace+plus/");
    s3_list_page_free(&p);
}

Test(s3_xml, url_encoding_type_is_decoded)
{
    const char *xml = HEAD "<ListBucketResult " NS "><EncodingType>url</EncodingType>"
                           "<IsTruncated>false</IsTruncated>"
                           "<Contents><Key>d/a+b%2Bc%26%0A.txt</Key><Size>1</Size></Contents>"
                           "<CommonPrefixes><Prefix>d/%C3%BC/</Prefix></CommonPrefixes>"
                           "</ListBucketResult>";
    struct s3_list_page p;
    cr_assert_eq(parse(xml, &p), 0);
    cr_expect_str_eq(p.objects[0].key, "d/a b+c&\n.txt");
    cr_expect_str_eq(p.prefixes[0], "d/\xc3\xbc/");
    s3_list_page_free(&p);
    const char *bad = HEAD "<ListBucketResult><EncodingType>url</EncodingType>"
                           "<Contents><Key>a%00b</Key><Size>1</Size></Contents></ListBucketResult>";
    cr_expect_eq(parse(bad, &p), -EINVAL);
}

Test(s3_xml, bad_fields_are_rejected)
{
    struct s3_list_page p;
    cr_expect_eq(
        parse("<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>", &p),
        -EINVAL, "Contents without Key");
    cr_expect_eq(parse("<ListBucketResult><Contents><Key>a</Key><Size>-1</Size></Contents>"
                       "</ListBucketResult>",
                       &p),
                 -EINVAL, "negative size");
    cr_expect_eq(parse("<ListBucketResult><Contents><Key>a</Key><Size>12x</Size></Contents>"
                       "</ListBucketResult>",
                       &p),
                 -EINVAL);
    cr_expect_eq(
        parse("<ListBucketResult><CommonPrefixes></CommonPrefixes></ListBucketResult>", &p),
        -EINVAL, "CommonPrefixes without Prefix");
}

Test(s3_xml, malformed_and_wrong_documents)
{
    struct s3_list_page p;
    cr_expect_eq(parse("", &p), -EINVAL);
    cr_expect_eq(parse("<ListBucketResult><Contents><Key>a</Key>", &p), -EINVAL);
    cr_expect_eq(parse("<html><body>Hello</body></html>", &p), -EINVAL);
    cr_expect_eq(parse("not xml at all", &p), -EINVAL);
    cr_expect_eq(parse(HEAD "<Error><Code>NoSuchBucket</Code></Error>", &p), -EINVAL);
    cr_expect_eq(s3_xml_parse_list(NULL, 0, &p), -EINVAL);
}

Test(s3_xml, entities_and_dtds_are_refused)
{
    const char *laughs =
        "<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\">"
        "<!ENTITY lol2 \"&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;\">"
        "<!ENTITY lol3 \"&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;\">]>"
        "<ListBucketResult><Contents><Key>&lol3;</Key><Size>1</Size></Contents>"
        "</ListBucketResult>";
    struct s3_list_page p;
    cr_expect_eq(parse(laughs, &p), -EINVAL);
    const char *xxe = "<?xml version=\"1.0\"?><!DOCTYPE x [<!ENTITY e SYSTEM "
                      "\"file:///etc/passwd\">]><ListBucketResult><Contents><Key>&e;</Key>"
                      "<Size>1</Size></Contents></ListBucketResult>";
    cr_expect_eq(parse(xxe, &p), -EINVAL);
    struct s3_error_body e;
    const char *err_xxe = "<!DOCTYPE x [<!ENTITY e SYSTEM \"file:///etc/passwd\">]>"
                          "<Error><Code>&e;</Code></Error>";
    cr_expect_eq(s3_xml_parse_error(err_xxe, strlen(err_xxe), &e), -EINVAL);
    cr_expect_str_eq(e.code, "");
}

Test(s3_xml, oversized_input_is_refused)
{
    size_t n = S3_XML_MAX_BYTES + 1;
    char *big = malloc(n);
    cr_assert_not_null(big);
    memset(big, ' ', n);
    memcpy(big, "<ListBucketResult>", 18);
    struct s3_list_page p;
    cr_expect_eq(s3_xml_parse_list(big, n, &p), -EFBIG);
    struct s3_error_body e;
    cr_expect_eq(s3_xml_parse_error(big, n, &e), -EFBIG);
    free(big);
}

Test(s3_xml, many_entries)
{
    size_t cap = 200000, len = 0;
    char *xml = malloc(cap);
    len += (size_t)snprintf(xml + len, cap - len, "<ListBucketResult>");
    for (int i = 0; i < 1000; i++)
        len += (size_t)snprintf(xml + len, cap - len,
                                "<Contents><Key>d/k%04d</Key><Size>%d</Size></Contents>", i, i);
    len += (size_t)snprintf(xml + len, cap - len, "</ListBucketResult>");
    struct s3_list_page p;
    cr_assert_eq(s3_xml_parse_list(xml, len, &p), 0);
    cr_expect_eq(p.nobjects, 1000);
    cr_expect_str_eq(p.objects[999].key, "d/k0999");
    cr_expect_eq(p.objects[999].size, 999);
    s3_list_page_free(&p);
    free(xml);
}

Test(s3_xml, error_body)
{
    const char *xml = HEAD "<Error><Code>NoSuchKey</Code><Message>The resource you requested does "
                           "not exist</Message><Resource>/mybucket/myfoto.jpg</Resource>"
                           "<RequestId>4442587FB7D0A2F9</RequestId></Error>";
    struct s3_error_body e;
    cr_assert_eq(s3_xml_parse_error(xml, strlen(xml), &e), 0);
    cr_expect_str_eq(e.code, "NoSuchKey");
    cr_expect_str_eq(e.message, "The resource you requested does not exist");
    cr_expect_str_eq(e.request_id, "4442587FB7D0A2F9");
    cr_expect_str_eq(e.region, "");
}

Test(s3_xml, error_body_region_and_sanitizing)
{
    const char *xml = "<Error><Code>AuthorizationHeaderMalformed</Code><Message>line1\nline2\t"
                      "</Message><Region>eu-west-1</Region><RequestId>R</RequestId></Error>";
    struct s3_error_body e;
    cr_assert_eq(s3_xml_parse_error(xml, strlen(xml), &e), 0);
    cr_expect_str_eq(e.region, "eu-west-1");
    cr_expect_str_eq(e.message, "line1 line2 ");
}

Test(s3_xml, error_body_long_fields_truncated)
{
    char xml[2048];
    char code[300];
    memset(code, 'C', sizeof code - 1);
    code[sizeof code - 1] = '\0';
    snprintf(xml, sizeof xml, "<Error><Code>%s</Code></Error>", code);
    struct s3_error_body e;
    cr_assert_eq(s3_xml_parse_error(xml, strlen(xml), &e), 0);
    cr_expect_eq(strlen(e.code), sizeof e.code - 1);
}

Test(s3_xml, error_body_malformed)
{
    struct s3_error_body e;
    cr_expect_eq(s3_xml_parse_error("<Error><Code>x", 14, &e), -EINVAL);
    cr_expect_eq(s3_xml_parse_error("<ListBucketResult/>", 19, &e), -EINVAL);
    cr_expect_eq(s3_xml_parse_error("", 0, &e), -EINVAL);
}

Test(s3_xml, iso8601)
{
    cr_expect_eq(s3_parse_iso8601("2009-10-12T17:50:30.000Z"), 1255369830);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T17:50:30Z"), 1255369830);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T17:50:30"), 1255369830);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T19:50:30.5+02:00"), 1255369830);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T16:50:30-0100"), 1255369830);
    cr_expect_eq(s3_parse_iso8601("1970-01-01T00:00:00.000Z"), 0);
    cr_expect_eq(s3_parse_iso8601("2009-13-12T17:50:30Z"), -1);
    cr_expect_eq(s3_parse_iso8601("2009-10-12 17:50:30Z"), -1);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T17:50:30.Z"), -1);
    cr_expect_eq(s3_parse_iso8601("2009-10-12T17:50:30Zjunk"), -1);
    cr_expect_eq(s3_parse_iso8601(""), -1);
    cr_expect_eq(s3_parse_iso8601(NULL), -1);
}

/* LastModified keeps its fraction: two saves within a second stay ordered. */
Test(s3_xml, iso8601_ns_keeps_the_fraction)
{
    cr_expect_eq(s3_parse_iso8601_ns("2009-10-12T17:50:30.123Z"), 1255369830123000000LL);
    cr_expect_eq(s3_parse_iso8601_ns("2009-10-12T17:50:30Z"), 1255369830000000000LL);
    cr_expect_eq(s3_parse_iso8601_ns("2009-10-12T19:50:30.5+02:00"), 1255369830500000000LL);
    cr_expect_eq(s3_parse_iso8601_ns("2009-10-12T17:50:30.123456789123Z"),
                 1255369830123456789LL); /* digits past nanoseconds dropped */
    cr_expect_eq(s3_parse_iso8601_ns("1969-12-31T23:59:59Z"), -1);
    cr_expect_eq(s3_parse_iso8601_ns("2009-10-12T17:50:30.Z"), -1);
    const char *xml = "<ListBucketResult><Contents><Key>k</Key>"
                      "<LastModified>2009-10-12T17:50:30.250Z</LastModified><Size>1</Size>"
                      "</Contents></ListBucketResult>";
    struct s3_list_page p;
    cr_assert_eq(s3_xml_parse_list(xml, strlen(xml), &p), 0);
    cr_expect_eq(p.objects[0].mtime_ns, 1255369830250000000LL);
    s3_list_page_free(&p);
}

/* ---- multipart uploads and copies --------------------------------------- */

Test(s3_xml, initiate_result)
{
    const char *xml = HEAD "<InitiateMultipartUploadResult " NS "><Bucket>bkt</Bucket>"
                           "<Key>a/b</Key><UploadId>VXBsb2FkIElE&amp;+/=</UploadId>"
                           "</InitiateMultipartUploadResult>";
    char id[STORE_UPLOAD_ID_MAX];
    cr_assert_eq(s3_xml_parse_initiate(xml, strlen(xml), id, sizeof id), 0);
    cr_expect_str_eq(id, "VXBsb2FkIElE&+/=");
}

Test(s3_xml, initiate_result_bad)
{
    char id[16];
    const char *no_id = "<InitiateMultipartUploadResult><Key>a</Key>"
                        "</InitiateMultipartUploadResult>";
    cr_expect_eq(s3_xml_parse_initiate(no_id, strlen(no_id), id, sizeof id), -EINVAL);
    cr_expect_str_eq(id, "");
    const char *empty = "<InitiateMultipartUploadResult><UploadId></UploadId>"
                        "</InitiateMultipartUploadResult>";
    cr_expect_eq(s3_xml_parse_initiate(empty, strlen(empty), id, sizeof id), -EINVAL);
    const char *longer = "<InitiateMultipartUploadResult><UploadId>0123456789abcdef</UploadId>"
                         "</InitiateMultipartUploadResult>";
    cr_expect_eq(s3_xml_parse_initiate(longer, strlen(longer), id, sizeof id), -EOVERFLOW,
                 "16 bytes do not fit 16 with the NUL");
    cr_expect_str_eq(id, "");
    const char *fits = "<InitiateMultipartUploadResult><UploadId>0123456789abcde</UploadId>"
                       "</InitiateMultipartUploadResult>";
    cr_expect_eq(s3_xml_parse_initiate(fits, strlen(fits), id, sizeof id), 0);
    const char *err = "<Error><Code>AccessDenied</Code><UploadId>x</UploadId></Error>";
    cr_expect_eq(s3_xml_parse_initiate(err, strlen(err), id, sizeof id), -EINVAL);
    cr_expect_eq(
        s3_xml_parse_initiate("<InitiateMultipartUploadResult><UploadId>x", 42, id, sizeof id),
        -EINVAL);
    cr_expect_eq(s3_xml_parse_initiate("", 0, id, sizeof id), -EINVAL);
}

Test(s3_xml, etag_results)
{
    char etag[STORE_ETAG_MAX];
    const char *complete =
        HEAD "<CompleteMultipartUploadResult " NS "><Location>http://b/k</Location>"
             "<Bucket>b</Bucket><Key>k</Key><ETag>&quot;3858f62230ac3c915f300c664312c11f-9&quot;"
             "</ETag></CompleteMultipartUploadResult>";
    cr_assert_eq(
        s3_xml_parse_etag(complete, strlen(complete), "CompleteMultipartUploadResult", etag), 0);
    cr_expect_str_eq(etag, "\"3858f62230ac3c915f300c664312c11f-9\"");
    const char *copy = HEAD "<CopyObjectResult><LastModified>2009-10-12T17:50:30.000Z"
                            "</LastModified><ETag>\"9b2cf535f27731c974343645a3985328\"</ETag>"
                            "</CopyObjectResult>";
    cr_assert_eq(s3_xml_parse_etag(copy, strlen(copy), "CopyObjectResult", etag), 0);
    cr_expect_str_eq(etag, "\"9b2cf535f27731c974343645a3985328\"");
    const char *part = "<CopyPartResult><ETag>\"p1\"</ETag></CopyPartResult>";
    cr_assert_eq(s3_xml_parse_etag(part, strlen(part), "CopyPartResult", etag), 0);
    cr_expect_str_eq(etag, "\"p1\"");
    cr_expect_eq(s3_xml_parse_etag(part, strlen(part), "CopyObjectResult", etag), -EINVAL,
                 "another root");
    /* moto names the Complete answer "...Response" */
    const char *moto = "<CompleteMultipartUploadResponse><ETag>\"m-2\"</ETag>"
                       "</CompleteMultipartUploadResponse>";
    cr_assert_eq(s3_xml_parse_etag(moto, strlen(moto), "CompleteMultipartUploadResult", etag), 0);
    cr_expect_str_eq(etag, "\"m-2\"");
    const char *none = "<CopyObjectResult><LastModified>x</LastModified></CopyObjectResult>";
    cr_assert_eq(s3_xml_parse_etag(none, strlen(none), "CopyObjectResult", etag), 0);
    cr_expect_str_eq(etag, "", "no ETag: empty, the caller asks HEAD");
}

Test(s3_xml, etag_results_bad)
{
    char etag[STORE_ETAG_MAX];
    const char *err = HEAD "<Error><Code>InternalError</Code><ETag>\"x\"</ETag></Error>";
    cr_expect_eq(s3_xml_parse_etag(err, strlen(err), "CopyObjectResult", etag), -EINVAL);
    cr_expect_str_eq(etag, "");
    char xml[512];
    char big[STORE_ETAG_MAX + 1];
    memset(big, 'e', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    snprintf(xml, sizeof xml, "<CopyPartResult><ETag>%s</ETag></CopyPartResult>", big);
    cr_expect_eq(s3_xml_parse_etag(xml, strlen(xml), "CopyPartResult", etag), -EOVERFLOW);
    cr_expect_str_eq(etag, "");
    cr_expect_eq(s3_xml_parse_etag("<CopyPartResult><ETag>", 22, "CopyPartResult", etag), -EINVAL);
    cr_expect_eq(s3_xml_parse_etag(xml, strlen(xml), NULL, etag), -EINVAL);
    const char *resp = "<CopyPartResponse><ETag>x</ETag></CopyPartResponse>";
    cr_expect_eq(s3_xml_parse_etag(resp, strlen(resp), "CopyObjectResult", etag), -EINVAL,
                 "...Response only of the same name");
}

Test(s3_xml, leading_whitespace_is_skipped)
{
    /* S3 keeps a long Complete or copy alive with spaces before the document */
    const char *xml = "   \n\t\r\n" HEAD "<CompleteMultipartUploadResult><ETag>\"e\"</ETag>"
                      "</CompleteMultipartUploadResult>";
    char etag[STORE_ETAG_MAX];
    cr_assert_eq(s3_xml_parse_etag(xml, strlen(xml), "CompleteMultipartUploadResult", etag), 0);
    cr_expect_str_eq(etag, "\"e\"");
    const char *err = "  \n" HEAD "<Error><Code>InternalError</Code></Error>";
    struct s3_error_body e;
    cr_assert_eq(s3_xml_parse_error(err, strlen(err), &e), 0);
    cr_expect_str_eq(e.code, "InternalError");
    cr_expect_eq(s3_xml_parse_error("   \n ", 5, &e), -EINVAL, "only whitespace");
}

Test(s3_xml, uploads_page)
{
    const char *xml =
        HEAD "<ListMultipartUploadsResult " NS "><Bucket>bkt</Bucket><KeyMarker></KeyMarker>"
             "<UploadIdMarker></UploadIdMarker><NextKeyMarker>d/k</NextKeyMarker>"
             "<NextUploadIdMarker>id-3</NextUploadIdMarker><MaxUploads>3</MaxUploads>"
             "<IsTruncated>true</IsTruncated>"
             "<Upload><Key>d/k</Key><UploadId>id-1</UploadId><Initiator><ID>x</ID></Initiator>"
             "<StorageClass>STANDARD</StorageClass><Initiated>2010-11-10T20:48:33.000Z"
             "</Initiated></Upload>"
             "<Upload><Key>d/k.tmp</Key><UploadId>id-2</UploadId></Upload>"
             "<Upload><UploadId>id-3</UploadId><Key>d/k</Key></Upload>"
             "</ListMultipartUploadsResult>";
    struct s3_upload_page p;
    cr_assert_eq(s3_xml_parse_uploads(xml, strlen(xml), &p), 0);
    cr_assert_eq(p.nuploads, 3);
    cr_expect_str_eq(p.uploads[0].key, "d/k");
    cr_expect_str_eq(p.uploads[0].upload_id, "id-1");
    cr_expect_str_eq(p.uploads[1].key, "d/k.tmp");
    cr_expect_str_eq(p.uploads[2].upload_id, "id-3");
    cr_expect_eq(p.is_truncated, 1);
    cr_expect_str_eq(p.next_key_marker, "d/k");
    cr_expect_str_eq(p.next_upload_id_marker, "id-3");
    s3_upload_page_free(&p);
    const char *empty = "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>"
                        "</ListMultipartUploadsResult>";
    cr_assert_eq(s3_xml_parse_uploads(empty, strlen(empty), &p), 0);
    cr_expect_eq(p.nuploads, 0);
    cr_expect_eq(p.is_truncated, 0);
    cr_expect_null(p.next_key_marker);
    s3_upload_page_free(&p);
}

Test(s3_xml, uploads_page_url_encoded)
{
    const char *xml = "<ListMultipartUploadsResult><EncodingType>url</EncodingType>"
                      "<IsTruncated>true</IsTruncated><NextKeyMarker>a%20b</NextKeyMarker>"
                      "<Upload><Key>a%20b%2Bc</Key><UploadId>x%20y</UploadId></Upload>"
                      "</ListMultipartUploadsResult>";
    struct s3_upload_page p;
    cr_assert_eq(s3_xml_parse_uploads(xml, strlen(xml), &p), 0);
    cr_expect_str_eq(p.uploads[0].key, "a b+c");
    cr_expect_str_eq(p.uploads[0].upload_id, "x%20y", "upload ids are not encoded");
    cr_expect_str_eq(p.next_key_marker, "a b");
    s3_upload_page_free(&p);
}

Test(s3_xml, uploads_page_bad)
{
    struct s3_upload_page p;
    const char *no_marker = "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>"
                            "<Upload><Key>a</Key><UploadId>i</UploadId></Upload>"
                            "</ListMultipartUploadsResult>";
    cr_expect_eq(s3_xml_parse_uploads(no_marker, strlen(no_marker), &p), -EINVAL,
                 "truncated without NextKeyMarker");
    cr_expect_eq(p.nuploads, 0);
    cr_expect_null(p.uploads);
    const char *no_id = "<ListMultipartUploadsResult><Upload><Key>a</Key></Upload>"
                        "</ListMultipartUploadsResult>";
    cr_expect_eq(s3_xml_parse_uploads(no_id, strlen(no_id), &p), -EINVAL);
    const char *no_key = "<ListMultipartUploadsResult><Upload><UploadId>i</UploadId></Upload>"
                         "</ListMultipartUploadsResult>";
    cr_expect_eq(s3_xml_parse_uploads(no_key, strlen(no_key), &p), -EINVAL);
    const char *list = "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>";
    cr_expect_eq(s3_xml_parse_uploads(list, strlen(list), &p), -EINVAL);
    const char *xxe = "<!DOCTYPE x [<!ENTITY e SYSTEM \"file:///etc/passwd\">]>"
                      "<ListMultipartUploadsResult><Upload><Key>&e;</Key><UploadId>i</UploadId>"
                      "</Upload></ListMultipartUploadsResult>";
    cr_expect_eq(s3_xml_parse_uploads(xxe, strlen(xxe), &p), -EINVAL);
    cr_expect_eq(s3_xml_parse_uploads("<ListMultipartUploadsResult><Upload>", 36, &p), -EINVAL);
    size_t n = S3_XML_MAX_BYTES + 1;
    char *big = malloc(n);
    cr_assert_not_null(big);
    memset(big, ' ', n);
    memcpy(big, "<ListMultipartUploadsResult>", 28);
    cr_expect_eq(s3_xml_parse_uploads(big, n, &p), -EFBIG);
    char id[8], etag[STORE_ETAG_MAX];
    cr_expect_eq(s3_xml_parse_initiate(big, n, id, sizeof id), -EFBIG);
    cr_expect_eq(s3_xml_parse_etag(big, n, "CopyObjectResult", etag), -EFBIG);
    free(big);
}

/* ---- the CompleteMultipartUpload body ------------------------------------ */

#define CMU_HEAD "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"

Test(s3_xml, complete_body_sorted_and_escaped)
{
    struct store_part parts[3] = {{.number = 10, .etag = "\"c\""},
                                  {.number = 2, .etag = "\"a&b<c>'d\""},
                                  {.number = 3, .etag = "plain"}};
    char *xml;
    size_t len;
    cr_assert_eq(s3_xml_build_complete(parts, 3, &xml, &len), 0);
    const char *want = CMU_HEAD "<Part><PartNumber>2</PartNumber>"
                                "<ETag>&quot;a&amp;b&lt;c&gt;&apos;d&quot;</ETag></Part>"
                                "<Part><PartNumber>3</PartNumber><ETag>plain</ETag></Part>"
                                "<Part><PartNumber>10</PartNumber><ETag>&quot;c&quot;</ETag>"
                                "</Part></CompleteMultipartUpload>";
    cr_expect_str_eq(xml, want);
    cr_expect_eq(len, strlen(want));
    free(xml);
}

Test(s3_xml, complete_body_many_parts_and_longest_etags)
{
    size_t n = STORE_MAX_PARTS;
    struct store_part *parts = calloc(n, sizeof *parts);
    cr_assert_not_null(parts);
    for (size_t i = 0; i < n; i++) {
        parts[i].number = (uint32_t)(n - i); /* descending: built ascending */
        memset(parts[i].etag, '"', STORE_ETAG_MAX - 1);
    }
    char *xml;
    size_t len;
    cr_assert_eq(s3_xml_build_complete(parts, n, &xml, &len), 0);
    cr_expect_eq(strlen(xml), len);
    cr_expect(strncmp(xml, CMU_HEAD "<Part><PartNumber>1</PartNumber><ETag>&quot;",
                      strlen(CMU_HEAD) + 40) == 0);
    const char *last = strstr(xml, "<PartNumber>10000</PartNumber>");
    cr_expect_not_null(last);
    cr_expect_null(strstr(last + 1, "<PartNumber>"), "10000 is the last part");
    free(xml);
    free(parts);
}

Test(s3_xml, complete_body_refuses_bad_parts)
{
    struct store_part parts[2] = {{.number = 1, .etag = "\"a\""}, {.number = 2, .etag = "\"b\""}};
    char *xml = (char *)1;
    size_t len = 1;
    cr_expect_eq(s3_xml_build_complete(parts, 0, &xml, &len), -EINVAL);
    cr_expect_null(xml);
    cr_expect_eq(len, 0);
    parts[1].number = 1;
    cr_expect_eq(s3_xml_build_complete(parts, 2, &xml, &len), -EINVAL, "a number twice");
    parts[1].number = 0;
    cr_expect_eq(s3_xml_build_complete(parts, 2, &xml, &len), -EINVAL, "number 0");
    parts[1].number = STORE_MAX_PARTS + 1;
    cr_expect_eq(s3_xml_build_complete(parts, 2, &xml, &len), -EINVAL, "number 10001");
    parts[1].number = 2;
    parts[1].etag[0] = '\0';
    cr_expect_eq(s3_xml_build_complete(parts, 2, &xml, &len), -EINVAL, "no ETag");
    cr_expect_eq(s3_xml_build_complete(NULL, 1, &xml, &len), -EINVAL);
    cr_expect_eq(s3_xml_build_complete(parts, STORE_MAX_PARTS + 1, &xml, &len), -EINVAL);
}
